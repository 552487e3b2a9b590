"""A committed example exported with ``jupyter nbconvert --to html`` shows its charts in a browser.

The examples are committed with their outputs; every chart we display
carries a static copy (an SVG ``<img>``) beside its widget, so a shared
notebook's HTML export shows the charts with no kernel and no widget state.
``tests/widgets/test_static_outputs.py`` reads the export's text; this test opens it
in Chromium from disk (``file://``) and looks at what is drawn.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys

import pytest

from .conftest import ROOT
from .pages import shot

pytestmark = pytest.mark.timeout(120)

NOTEBOOK = os.path.join(ROOT, "notebooks", "04-mixture-of-experts.ipynb")


def _committed_alts(path: str) -> list[str]:
    """The alt texts of the static chart images in the notebook's committed outputs."""
    with open(path, encoding="utf-8") as f:
        nb = json.load(f)
    alts: list[str] = []
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            html = out.get("data", {}).get("text/html", "")
            html = "".join(html) if isinstance(html, list) else html
            alts += re.findall(r'<img alt="([^"]*)"[^>]*src="data:image/svg\+xml', html)
    return alts


def _coloured_fraction(png: bytes) -> float:
    """The share of pixels with a clear hue (a series line, a heatmap cell), not white, grey or black."""
    from PIL import Image, ImageChops

    hsv = Image.open(io.BytesIO(png)).convert("RGB").convert("HSV")
    saturated = hsv.getchannel("S").point(lambda x: 255 if x > 60 else 0)
    lit = hsv.getchannel("V").point(lambda x: 255 if x > 60 else 0)
    coloured = ImageChops.multiply(saturated, lit).histogram()[255]
    return coloured / max(1, hsv.width * hsv.height)


def test_nbconvert_html_of_an_executed_example_shows_its_charts_in_chromium(browser, artifacts, tmp_path):
    alts = _committed_alts(NOTEBOOK)
    # the notebook's own charts: a line chart and the six routing heatmaps (two runs' worth each)
    assert "moe: dropped_tokens" in alts, alts
    assert sum(a.startswith("moe: tokens_per_expert") for a in alts) >= 6, alts

    # `jupyter nbconvert`, without the launcher's second Python start
    done = subprocess.run(
        [sys.executable, "-m", "nbconvert", "--to", "html", NOTEBOOK, "--output-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    html = tmp_path / "04-mixture-of-experts.html"
    assert html.exists(), done.stderr[-2000:]

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    try:
        page.goto(html.as_uri(), wait_until="load")
        body = page.inner_text("body")
        assert "model not found" not in body and "Error displaying widget" not in body
        images = page.locator('img[src^="data:image/svg+xml"]')
        shown = [images.nth(i).get_attribute("alt") or "" for i in range(images.count())]
        assert sorted(shown) == sorted(alts), (shown, alts)
        for i, alt in enumerate(shown):
            img = images.nth(i)
            img.scroll_into_view_if_needed()
            assert img.is_visible(), alt
            # decoded (a broken data URI has no natural size) and laid out at a readable size
            natural = img.evaluate("e => [e.complete, e.naturalWidth, e.naturalHeight]")
            assert natural[0] and natural[1] > 0 and natural[2] > 0, (alt, natural)
            box = img.bounding_box()
            assert box is not None and box["width"] >= 100 and box["height"] >= 50, (alt, box)
            # something is drawn in colour: a series line or heatmap cells, not a blank frame
            # (a legend's swatches alone are ~0.5 % of a line chart; its lines 3-5 %, a heatmap 40-50 %)
            assert _coloured_fraction(img.screenshot()) > 0.015, alt
        page.locator('img[alt="moe: dropped_tokens"]').scroll_into_view_if_needed()
        shot(page, artifacts, "nbconvert-04-dropped-tokens.png")
        images.last.scroll_into_view_if_needed()
        shot(page, artifacts, "nbconvert-04-heatmaps.png")
    finally:
        page.close()
