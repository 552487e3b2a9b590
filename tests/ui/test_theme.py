"""Light → dark → light with the sweep table and the panel's live charts shown: no error, charts re-drawn.

A 6-config ``%%parallel`` sweep (``lr × aux``) on a real cluster reports its
loss to one topic; the notebook shows its runs table (grouped by ``aux``,
brushed to two ``lr`` values) and its metrics, and the panel shows the
cluster's live charts.
JupyterLab's theme command switches to JupyterLab Dark and back: the page
raises no uncaught error and logs no error of ours (the ``page_errors`` fixture
of conftest.py), and every chart and the parallel coordinates are drawn anew in
the theme's palette.  Screenshots: test-artifacts/theme-sweep-{light,dark}.png
and theme-panel-{light,dark}.png.
"""

from __future__ import annotations

import os
import re

import nbformat
import pytest

from .conftest import ROOT
from .pages import EXECUTE_JS, RUN_ALL_WHEN_READY_JS, lab_page, notebook_ready, open_panel, shot

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(300)]

CLUSTER = "ui-theme"
NOTEBOOK_CELLS = [
    f"import jupyter_cluster as jc\n%load_ext jupyter_cluster\n%cluster start --name {CLUSTER} --workers 2 --threads 1",
    """%%parallel cfg in [{'lr': lr, 'aux': aux} for lr in (1e-3, 3e-3, 1e-2) for aux in (True, False)]
import jupyter_cluster as jc
for step in range(6):
    jc.report(step=step, topic='theme', loss=1 / (1 + 100 * cfg['lr']) + 0.1 * (not cfg['aux']) + 1 / (step + 1))""",
    "jc.show_runs(topic='theme')",
    "jc.show_metrics('theme')",
]
SWEEP = ".jp-OutputArea .jc-sweep"
PANEL = "#jupyter-cluster-panel"


def _palette(name: str) -> set[str]:
    """A palette of labextension/src/charts/colors.ts (LIGHT_PALETTE or DARK_PALETTE), lower-case hex."""
    with open(os.path.join(ROOT, "labextension/src/charts/colors.ts"), encoding="utf-8") as f:
        text = f.read()
    body = re.search(rf"export const {name} = \[(.*?)\]", text, re.S).group(1)
    return {c.lower() for c in re.findall(r"#[0-9a-fA-F]{6}", body)}


# What is drawn now: the page's theme, the panel's charts (theme, redraws, series colours), the sweep's
READ_JS = f"""() => {{
  const sweep = document.querySelector({SWEEP!r});
  const lines = [...document.querySelectorAll('#jupyter-cluster-panel .jc-metrics-line, .jp-OutputArea .jc-metrics-line')];
  return {{
    light: document.body.dataset.jpThemeLight,
    panelTheme: [...document.querySelectorAll('#jupyter-cluster-panel .jc-metrics, .jp-OutputArea .jc-metrics')].map(
      m => m.dataset.theme),
    panelDraws: lines.map(l => Number(l.dataset.draws)),
    panelColors: lines.flatMap(l => (l.dataset.colors || '').split('|').filter(Boolean)),
    panelCanvases: lines.map(l => l.querySelector('canvas')?.width || 0),
    sweepTheme: sweep.dataset.theme,
    sweepColors: (sweep.querySelector('.jc-sweep-parallel').dataset.colors || '').split('|').filter(Boolean)
  }};
}}"""


# Pixels of the first panel line chart's canvases within a small distance of colour ``hex``.
PIXELS_JS = f"""(hex) => {{
  const rgb = [1, 3, 5].map(i => parseInt(hex.slice(i, i + 2), 16));
  const chart = document.querySelector('{PANEL} .jc-metrics-line');
  let n = 0;
  for (const canvas of chart.querySelectorAll('canvas')) {{
    if (!canvas.width || !canvas.height) continue;
    const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
    for (let i = 0; i < data.length; i += 4) {{
      if (data[i + 3] < 200) continue;
      if (Math.abs(data[i] - rgb[0]) + Math.abs(data[i + 1] - rgb[1]) + Math.abs(data[i + 2] - rgb[2]) < 30) n++;
    }}
  }}
  return n;
}}"""


def _drawn_in(page, colors: list[str]) -> int:
    """How many pixels of the panel's first line chart are in the first of its series' ``colors``."""
    return page.evaluate(PIXELS_JS, colors[0])


def _switch(page, theme: str, light: bool, before: dict) -> dict:
    """Run JupyterLab's Settings → Theme command; wait until the sweep and every panel chart are drawn again."""
    page.evaluate(f"window.jupyterapp.commands.execute('apputils:change-theme', {{ theme: {theme!r} }})")
    want = "light" if light else "dark"
    draws = before["panelDraws"]
    page.wait_for_function(
        f"""() => {{
          const r = ({READ_JS})();
          return r.light === '{str(light).lower()}' && r.sweepTheme === '{want}'
            && r.panelTheme.length > 0 && r.panelTheme.every(t => t === '{want}')
            && r.panelDraws.length === {len(draws)} && r.panelDraws.every((d, i) => d > {draws}[i]);
        }}""",
        timeout=30_000,
    )
    page.wait_for_timeout(500)  # a frame for ECharts to paint (the canvases are shot)
    return page.evaluate(READ_JS)


def test_switching_theme_with_the_sweep_and_the_panels_charts_shown_redraws_them_without_an_error(
    lab, browser, artifacts, page_errors
):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in NOTEBOOK_CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, os.path.join(lab.root_dir, "theme.ipynb"))
    light, dark = _palette("LIGHT_PALETTE"), _palette("DARK_PALETTE")
    assert len(light) >= 10 and len(dark) >= 10 and not light & dark
    with lab_page(browser, lab, "lab/tree/theme.ipynb", artifacts=artifacts, last_shot="theme-last.png") as page:
        try:
            notebook_ready(page)
            page.evaluate(RUN_ALL_WHEN_READY_JS, False)
            page.wait_for_function(
                f"(() => {{ const s = document.querySelector({SWEEP!r});"
                " return !!s && s.dataset.rows === '6' && !!s.querySelector('.jc-sweep-parallel')?.dataset.colors; })()",
                timeout=180_000,
            )
            page.wait_for_function(
                "[...document.querySelectorAll('.jp-OutputArea .jc-metrics-line')].some("
                "l => (l.dataset.series || '').split('|').length === 6)",
                timeout=60_000,
            )
            open_panel(page)
            page.click(f'{PANEL} .jc-cluster[data-name="{CLUSTER}"] .jc-cluster-name', timeout=60_000)
            page.wait_for_function(
                f"""() => [...document.querySelectorAll('{PANEL} .jc-metrics-line')].some(
                      l => (l.dataset.series || '').split('|').length === 6 && !!l.querySelector('canvas'))""",
                timeout=60_000,
            )
            # the table grouped by aux, brushed to lr 1e-3 and 3e-3: 2 groups of 2, one expanded
            sweep = page.locator(SWEEP).first
            sweep.locator("select.jc-sweep-group").select_option("aux")
            page.evaluate(f"document.querySelector({SWEEP!r}).jcSweepView.brush('lr', [0.0008, 0.0035])")
            page.wait_for_function(
                f"document.querySelector({SWEEP!r}).querySelectorAll('tr.jc-sweep-group-row').length === 2"
                f" && document.querySelector({SWEEP!r}).dataset.rows === '4'",
                timeout=15_000,
            )
            sweep.locator("tr.jc-sweep-group-row").first.click()
            sweep.scroll_into_view_if_needed()

            seen = page.evaluate(READ_JS)
            assert seen["light"] == "true" and set(seen["panelColors"]) <= light, seen
            assert seen["sweepColors"] and set(seen["sweepColors"]) <= light, seen
            shot(page, artifacts, "theme-sweep-light.png", SWEEP + " >> nth=0")
            shot(page, artifacts, "theme-panel-light.png", PANEL)

            first = page.locator(f"{PANEL} .jc-metrics-line").first.get_attribute("data-colors").split("|")
            assert _drawn_in(page, first) > 20, first  # the canvas shows the light palette's line

            seen = _switch(page, "JupyterLab Dark", False, seen)
            now = page.locator(f"{PANEL} .jc-metrics-line").first.get_attribute("data-colors").split("|")
            # the same series, drawn anew on the canvas in the dark palette's colour, not the light one's
            assert _drawn_in(page, now) > 20 and _drawn_in(page, first) < 10, (first, now)
            assert seen["panelColors"] and set(seen["panelColors"]) <= dark, seen
            assert seen["sweepColors"] and set(seen["sweepColors"]) <= dark, seen
            assert all(seen["panelCanvases"]), seen  # drawn anew, not left as empty boxes
            assert not page_errors.unexpected(), page_errors.unexpected()
            shot(page, artifacts, "theme-sweep-dark.png", SWEEP + " >> nth=0")
            shot(page, artifacts, "theme-panel-dark.png", PANEL)

            seen = _switch(page, "JupyterLab Light", True, seen)
            assert seen["panelColors"] and set(seen["panelColors"]) <= light, seen
            assert seen["sweepColors"] and set(seen["sweepColors"]) <= light, seen
            assert not page_errors.unexpected(), page_errors.unexpected()
        finally:
            page.evaluate(EXECUTE_JS, f"jc.stop({CLUSTER!r})")
