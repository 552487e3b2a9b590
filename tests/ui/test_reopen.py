"""A notebook run and saved in a real JupyterLab, reopened after a server restart, shows its results.

Before, every widget output of a reopened notebook read "Error displaying widget:
model not found" (the widget renderer never falls back to the bundle's other
mimetypes).  Now the outputs carry static copies, the server's pre-save hook keeps
only those in the saved file, and the reopened notebook shows the chart (an SVG
image), the final progress line and the cluster table.  Screenshots go to
test-artifacts/ (reopen-live.png, reopen-after-restart.png).
"""

from __future__ import annotations

import json
import os

import nbformat
import pytest

from ..jupyter_process import JupyterProcess
from .pages import RUN_ALL_WHEN_READY_JS, lab_page, shot

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]

NAME = "ui-reopen"
CELLS = [
    f"%load_ext jupyter_cluster\nimport jupyter_cluster as jc\n%cluster start --name {NAME} --workers 1",
    'jc.show_metrics("reopen")',
    """%%parallel i in range(8)
import time
import jupyter_cluster
time.sleep(0.3)
jupyter_cluster.report(step=i, topic="reopen", loss=1.0 / (i + 1))
jupyter_cluster.report(step=i, topic="reopen", load=[float(i), 8.0 - i, 1.0])
i""",
    "%cluster stop",
]

CHART = 'img[alt="reopen: loss"]'


def _ready(page) -> None:
    page.wait_for_function("!!window.jupyterapp && !!window.jupyterapp.shell.currentWidget?.context", timeout=90_000)
    page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=90_000)


def test_reopened_notebook_shows_static_results_after_a_server_restart(browser, artifacts, tmp_path):
    root = str(tmp_path)
    path = os.path.join(root, "reopen.ipynb")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)

    lab = JupyterProcess(root, app="lab", base_url="/").start(timeout=120)
    try:
        with lab_page(browser, lab, "lab/tree/reopen.ipynb", artifacts=artifacts, last_shot="reopen-live.png") as page:
            _ready(page)
            page.evaluate(RUN_ALL_WHEN_READY_JS, True)  # and save
            # live: the chart is the widget (its static copy is in the output, not drawn)
            page.wait_for_selector(".jp-OutputArea-output .jupyter-widgets", timeout=60_000)
            assert page.locator(CHART).count() == 0
            # the finished map's progress bar became its static final line
            page.wait_for_selector(".jupyter-cluster-progress", timeout=60_000)
    finally:
        lab.stop()

    with open(path) as f:
        saved = json.load(f)
    outputs = [o for c in saved["cells"] for o in c.get("outputs", ())]
    ours = [o for o in outputs if "jupyter_cluster" in o.get("metadata", {})]
    assert len(ours) >= 3, outputs  # cluster table, chart, progress line
    assert not any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in ours)
    assert all("text/html" in o["data"] and "text/plain" in o["data"] for o in ours)

    lab = JupyterProcess(root, app="lab", base_url="/").start(timeout=120)
    try:
        with lab_page(
            browser, lab, "lab/tree/reopen.ipynb", artifacts=artifacts, last_shot="reopen-after-restart.png"
        ) as page:
            _ready(page)
            chart = page.locator(CHART)
            chart.wait_for(state="visible", timeout=60_000)
            page.wait_for_function(f"document.querySelector('{CHART}').naturalWidth > 0", timeout=10_000)
            heat = page.locator('img[alt^="reopen: load"]')
            assert heat.count() == 1 and heat.is_visible()
            progress = page.locator(".jupyter-cluster-progress")
            assert progress.count() == 1 and "8/8" in progress.inner_text() and "finished" in progress.inner_text()
            table = page.locator("table.jupyter-cluster-workers")
            assert table.count() == 1 and "total" in table.inner_text()
            body = page.locator(".jp-NotebookPanel").inner_text()
            assert "model not found" not in body and "Error displaying widget" not in body
            chart.scroll_into_view_if_needed()
            shot(page, artifacts, "reopen-static-chart.png")
    finally:
        lab.stop()


def test_a_published_example_shows_its_charts_in_jupyterlab(browser, artifacts, tmp_path):
    """The committed MoE notebook, opened as a reader would (untrusted, never run here): the six
    tokens-per-expert heatmaps and the line charts are drawn from their static copies."""
    import shutil

    name = "04-mixture-of-experts.ipynb"
    shutil.copy(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "notebooks", name), tmp_path)
    lab = JupyterProcess(str(tmp_path), app="lab", base_url="/").start(timeout=120)
    try:
        with lab_page(browser, lab, f"lab/tree/{name}", artifacts=artifacts, last_shot="published-moe.png") as page:
            _ready(page)
            heatmaps = page.locator('img[alt^="moe: tokens_per_expert"]')
            heatmaps.first.wait_for(state="attached", timeout=60_000)
            assert heatmaps.count() == 6
            assert page.locator('img[alt="moe: dropped_tokens"]').count() == 1
            # drawn: every image decoded (JupyterLab's sanitizer keeps data: URIs of untrusted HTML)
            heatmaps.last.scroll_into_view_if_needed()
            page.wait_for_function(
                "[...document.querySelectorAll('img[alt^=\"moe: \"]')].every(i => i.complete && i.naturalWidth > 0)",
                timeout=30_000,
            )
            shot(page, artifacts, "published-moe-heatmaps.png")
            assert "Error displaying widget" not in page.locator(".jp-NotebookPanel").inner_text()
    finally:
        lab.stop()
