"""The sidebar panel in a real JupyterLab, driven through Debian's Chromium.

One scenario, as a user would do it: open the panel, start a cluster from it,
open a notebook that attaches to that cluster and maps a cell which reports a
scalar and a vector metric, then check the panel shows the worker rows, the
job's progress, a line chart and a heatmap with data.  Screenshots go to
test-artifacts/.
"""

from __future__ import annotations

import os
import time

import nbformat
import pytest

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

CLUSTER = "ui-panel"
ITEMS = 48

NOTEBOOK_CELLS = [
    f"import jupyter_cluster\n%load_ext jupyter_cluster\n%cluster connect {CLUSTER}",
    'jupyter_cluster.show_metrics("ui")',
    f"""%%parallel i in range({ITEMS}) --out doubled
import time
import jupyter_cluster
time.sleep(0.15)
jupyter_cluster.report(step=i // 3, topic="ui", member=i % 3, reward=(i // 3) ** 0.5 + i % 3,
                       tokens_per_expert=[((i // 3) * (k + 1)) % 7 for k in range(8)])
i * 2""",
    f'assert doubled == [2 * i for i in range({ITEMS})]\nprint("mapped", len(doubled))',
]

# Pixels that carry colour (series lines, heatmap cells) rather than the
# white/grey of background, axes and labels.
COLOURED_PIXELS_JS = """
(panel) => {
  let n = 0;
  // ECharts may draw a chart on several layered canvases (progressive rendering)
  for (const canvas of panel.querySelectorAll('canvas')) {
    if (!canvas.width || !canvas.height) continue;
    const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
    for (let i = 0; i < data.length; i += 4) {
      const r = data[i], g = data[i + 1], b = data[i + 2], a = data[i + 3];
      if (a < 128) continue;
      const max = Math.max(r, g, b), min = Math.min(r, g, b);
      if (max - min > 60) n++;
    }
  }
  return n;
}
"""


# Run All only once the kernel has answered kernel_info: a request sent while
# the kernel is still connecting can be lost.
RUN_ALL_WHEN_READY_JS = """
async () => {
  const app = window.jupyterapp;
  const panel = app.shell.currentWidget;
  await panel.sessionContext.ready;
  await panel.sessionContext.session.kernel.info;
  await app.commands.execute('notebook:run-all-cells');
}
"""


def _write_notebook(path: str) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in NOTEBOOK_CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


def _open_panel(page) -> None:
    panel = page.locator("#jupyter-cluster-panel")
    if not panel.is_visible():
        page.locator('.jp-SideBar .lm-TabBar-tab[data-id="jupyter-cluster-panel"]').click()
    panel.wait_for(state="visible", timeout=30_000)


def _shot(page, artifacts: str, name: str, selector: str | None = None) -> str:
    path = os.path.join(artifacts, name)
    if selector:
        page.locator(selector).screenshot(path=path)
    else:
        page.screenshot(path=path, full_page=False)
    return path


def test_panel_starts_a_cluster_and_shows_workers_jobs_and_metrics(lab, browser, artifacts):
    _write_notebook(os.path.join(lab.root_dir, "ui.ipynb"))
    context = browser.new_context(viewport={"width": 1500, "height": 1000})
    page = context.new_page()
    console_errors: list[str] = []
    page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
    try:
        page.goto(f"{lab.url}lab?token={lab.token}", timeout=90_000)
        page.wait_for_selector("#jp-main-dock-panel", timeout=90_000)

        # -- the panel, and a cluster started from it --------------------------------
        _open_panel(page)
        page.wait_for_selector("#jupyter-cluster-panel .jc-clusters", timeout=30_000)
        page.click("#jupyter-cluster-panel .jc-new")
        page.fill(".jp-Dialog .jc-input-name", CLUSTER)
        page.fill(".jp-Dialog .jc-input-workers", "2")
        page.click(".jp-Dialog .jp-mod-accept")
        item = page.locator(f'#jupyter-cluster-panel .jc-cluster[data-name="{CLUSTER}"]')
        item.wait_for(timeout=120_000)
        assert "owner: panel" in item.inner_text()
        page.wait_for_function(
            "document.querySelectorAll('#jupyter-cluster-panel .jc-worker').length === 2", timeout=60_000
        )
        statuses = page.locator("#jupyter-cluster-panel .jc-worker .jc-worker-status").all_inner_texts()
        assert statuses == ["running", "running"]
        _shot(page, artifacts, "panel-cluster-started.png", "#jupyter-cluster-panel")

        # -- a notebook that attaches to it, maps a cell and reports metrics ------------
        page.goto(f"{lab.url}lab/tree/ui.ipynb", timeout=90_000)
        page.wait_for_selector(".jp-NotebookPanel .jp-Notebook .jp-Cell", timeout=90_000)
        page.wait_for_selector('.jp-Notebook-ExecutionIndicator[data-status="idle"]', timeout=90_000)
        picker = page.locator(".jp-Dialog .jp-mod-accept")
        if picker.count():  # a kernel picker despite autoStartDefaultKernel: take the default
            picker.click()
        page.evaluate(RUN_ALL_WHEN_READY_JS)
        _open_panel(page)
        # after the reload the panel selects the oldest cluster: pick ours (other tests' may live)
        page.click(f'#jupyter-cluster-panel .jc-cluster[data-name="{CLUSTER}"] .jc-cluster-name')
        # the job appears while it runs, then finishes with every item done
        job = page.locator("#jupyter-cluster-panel .jc-job").first
        job.wait_for(timeout=120_000)
        page.wait_for_function(
            f"[...document.querySelectorAll('#jupyter-cluster-panel .jc-job-count')]"
            f".some(e => e.textContent.startsWith('{ITEMS} / {ITEMS}'))",
            timeout=120_000,
        )
        page.wait_for_selector(".jp-OutputArea-output >> text=mapped 48", timeout=60_000)
        finished = page.locator("#jupyter-cluster-panel .jc-job", has_text=f"{ITEMS} / {ITEMS}").first
        assert "%%parallel" in finished.locator(".jc-job-label").inner_text()
        assert finished.locator(".jc-job-state").inner_text() == "finished"
        width = finished.locator(".jc-bar-fill").evaluate("e => e.style.width")
        assert float(width.rstrip("%")) == 100.0, width

        # -- metrics: a line chart and a heatmap, both drawn with data ------------------
        page.wait_for_function(
            "document.querySelectorAll('#jupyter-cluster-panel .jc-charts .jc-metrics-panel canvas').length >= 2",
            timeout=60_000,
        )
        status = page.locator("#jupyter-cluster-panel .jc-metrics-status")
        page.wait_for_function(
            f"(document.querySelector('#jupyter-cluster-panel .jc-metrics-status') || {{}}).textContent"
            f"?.includes('{ITEMS} reports')",
            timeout=30_000,
        )
        assert "3 series" in status.inner_text()
        time.sleep(0.5)  # let ECharts finish its frame before reading pixels
        panels = page.locator("#jupyter-cluster-panel .jc-charts .jc-metrics-panel")
        assert panels.count() == 2
        line_pixels = panels.nth(0).evaluate(COLOURED_PIXELS_JS)
        heat_pixels = panels.nth(1).evaluate(COLOURED_PIXELS_JS)
        assert line_pixels > 200, f"the line chart looks empty ({line_pixels} coloured pixels)"
        assert heat_pixels > 2000, f"the heatmap looks empty ({heat_pixels} coloured pixels)"
        # series selection: switching a member off redraws without it
        series = page.locator("#jupyter-cluster-panel .jc-series-item")
        assert series.count() == 3
        series.nth(0).locator("input").uncheck()
        assert series.nth(0).locator("input").is_checked() is False
        _shot(page, artifacts, "panel-workers-jobs-metrics.png", "#jupyter-cluster-panel")
        _shot(page, artifacts, "lab-notebook-and-panel.png")

        # -- buttons: Connect inserts the magic into the notebook, Scale asks the owner ----
        item.locator(".jc-connect").click()
        page.wait_for_function(
            f"[...document.querySelectorAll('.jp-NotebookPanel .jp-Cell .jp-InputArea-editor')]"
            f".filter(e => e.textContent.includes('%cluster connect {CLUSTER}')).length === 2",
            timeout=15_000,
        )
        item.locator(".jc-scale").click()
        page.fill(".jp-Dialog .jc-input-workers", "1")
        page.click(".jp-Dialog .jp-mod-accept")
        page.wait_for_function(
            "document.querySelectorAll('#jupyter-cluster-panel .jc-worker').length === 1", timeout=60_000
        )
        page.locator(".jp-NotebookPanel .jp-OutputArea-output").nth(1).scroll_into_view_if_needed()
        _shot(page, artifacts, "notebook-widgets.png", ".jp-NotebookPanel")
        # no error from our extension in the browser console
        ours = [e for e in console_errors if "jupyter-cluster" in e]
        assert not ours, ours
    finally:
        _shot(page, artifacts, "panel-last-state.png")
        context.close()


def test_panel_in_notebook_7(lab, browser, artifacts):
    """The same extension in Notebook 7's notebook page: its left sidebar shows the panel."""
    pytest.importorskip("notebook", minversion="7", reason="Notebook 7 is in the test extras")
    context = browser.new_context(viewport={"width": 1300, "height": 900})
    page = context.new_page()
    try:
        page.goto(f"{lab.url}notebooks/ui.ipynb?token={lab.token}", timeout=90_000)
        page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=90_000)
        page.wait_for_function("!!window.jupyterapp && window.jupyterapp.commands.hasCommand('jupyter-cluster:open')", timeout=30_000)
        page.evaluate("window.jupyterapp.commands.execute('jupyter-cluster:open')")
        page.wait_for_selector("#jupyter-cluster-panel", state="visible", timeout=30_000)
        # the cluster started from JupyterLab's panel is listed here too
        page.click(f'#jupyter-cluster-panel .jc-cluster[data-name="{CLUSTER}"] .jc-cluster-name', timeout=30_000)
        page.wait_for_selector("#jupyter-cluster-panel .jc-worker", timeout=30_000)
        _shot(page, artifacts, "notebook7-panel.png")
        # Stop, confirmed in the dialog: the cluster leaves the list
        page.click(f'#jupyter-cluster-panel .jc-cluster[data-name="{CLUSTER}"] .jc-stop')
        page.click(".jp-Dialog .jp-mod-accept")
        page.wait_for_selector(f'#jupyter-cluster-panel .jc-cluster[data-name="{CLUSTER}"]', state="detached", timeout=60_000)
        # the notebook's attachment to it ("ui-panel-attached-1") is no cluster either
        page.wait_for_function(
            f"![...document.querySelectorAll('#jupyter-cluster-panel .jc-cluster')]"
            f".some(e => e.dataset.name.startsWith('{CLUSTER}'))",
            timeout=15_000,
        )
    finally:
        _shot(page, artifacts, "notebook7-last-state.png")
        context.close()
