"""The sidebar panel in a real JupyterLab, driven through Debian's Chromium.

One scenario, as a user would do it: open the panel, start two clusters from
it, open a notebook that attaches to the second and maps a cell which reports
a scalar and a vector metric (three runs of different scale), then check the
panel follows the notebook's work to its cluster and shows the worker rows, the
job's progress, a line chart and the heatmaps of every run on one colour
scale; that the charts follow the sidebar's width, re-style on a theme switch
and round their tooltips; that a bad Scale value keeps the dialog open with its
error; and that stopping the cluster keeps its jobs and curves.  Screenshots go
to test-artifacts/.
"""

from __future__ import annotations

import os
import re

import nbformat
import pytest

from .pages import RUN_ALL_WHEN_READY_JS, drag_sidebar_to, lab_page, notebook_ready, open_panel, shot

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

CLUSTER = "ui-panel"
OTHER = "ui-other"  # the panel shows it when the notebook starts its work on CLUSTER
ITEMS = 48

NOTEBOOK_CELLS = [
    f"import jupyter_cluster\n%load_ext jupyter_cluster\n%cluster connect {CLUSTER}",
    'jupyter_cluster.show_metrics("ui")',
    f"""%%parallel i in range({ITEMS}) --out doubled --sweep
import time
import jupyter_cluster
time.sleep(0.15)
jupyter_cluster.report(step=i // 3, topic="ui", member=i % 3, reward=(i // 3) ** 0.5 + i % 3 + 0.123456789,
                       tokens_per_expert=[((i // 3) * (k + 1)) % 7 * (i % 3 + 1) for k in range(8)])
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


# Light pixels in the chart's title (top left): none in the light theme, where
# the title is dark text on a transparent background; many in the dark theme.
TITLE_LIGHT_PIXELS_JS = """
(panel) => {
  const canvas = panel.querySelector('canvas');
  const dpr = canvas.width / canvas.getBoundingClientRect().width;
  const data = canvas.getContext('2d').getImageData(0, 0, Math.round(70 * dpr), Math.round(20 * dpr)).data;
  let n = 0;
  for (let i = 0; i < data.length; i += 4) {
    if (data[i + 3] > 160 && Math.min(data[i], data[i + 1], data[i + 2]) > 170) n++;
  }
  return n;
}
"""

# Pixels within a small distance of one RGB colour (a series' line).
COLOUR_PIXELS_JS = """
(panel, rgb) => {
  let n = 0;
  for (const canvas of panel.querySelectorAll('canvas')) {
    if (!canvas.width || !canvas.height) continue;
    const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
    for (let i = 0; i < data.length; i += 4) {
      if (data[i + 3] < 200) continue;
      if (Math.abs(data[i] - rgb[0]) + Math.abs(data[i + 1] - rgb[1]) + Math.abs(data[i + 2] - rgb[2]) < 40) n++;
    }
  }
  return n;
}
"""

CANVAS_WIDTH_JS = "(e) => Math.round(e.querySelector('canvas').getBoundingClientRect().width)"


def _wait_coloured(page, selector: str, minimum: int, nth: int = 0, timeout: float = 10_000) -> int:
    """Wait until the ``nth`` element matching ``selector`` has drawn more than ``minimum`` coloured pixels."""
    page.wait_for_function(
        f"(() => {{ const f = {COLOURED_PIXELS_JS}; const e = document.querySelectorAll({selector!r})[{nth}];"
        f" return !!e && f(e) > {minimum}; }})()",
        timeout=timeout,
    )
    return page.locator(selector).nth(nth).evaluate(COLOURED_PIXELS_JS)


def _write_notebook(path: str) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in NOTEBOOK_CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


def _chart_fits(page, width_range: tuple[float, float]) -> int:
    """Wait until the first line chart's canvas is within ``width_range`` px and inside the panel; its width."""
    lo, hi = width_range
    page.wait_for_function(
        f"""() => {{
          const p = document.querySelector('#jupyter-cluster-panel');
          const c = p && p.querySelector('.jc-metrics-line canvas');
          if (!c) return false;
          const w = c.getBoundingClientRect().width;
          return w >= {lo} && w <= {hi} && w <= p.clientWidth;
        }}""",
        timeout=10_000,
    )
    return page.locator("#jupyter-cluster-panel .jc-metrics-line").first.evaluate(CANVAS_WIDTH_JS)


def test_panel_starts_a_cluster_and_shows_workers_jobs_and_metrics(lab, browser, artifacts):
    _write_notebook(os.path.join(lab.root_dir, "ui.ipynb"))
    with lab_page(browser, lab, "lab", artifacts=artifacts, last_shot="panel-last-state.png") as page:
        page.wait_for_selector("#jp-main-dock-panel", timeout=90_000)

        # -- the panel, and a cluster started from it --------------------------------
        open_panel(page)
        page.wait_for_selector("#jupyter-cluster-panel .jc-clusters", timeout=30_000)
        # another cluster, which the panel will show when the notebook starts its work
        page.click("#jupyter-cluster-panel .jc-new")
        # the backends configured on this server, the default first; threads and memory per worker
        # (the dialog opens once the server's config has come back: wait for it, not for a fixed time)
        page.wait_for_selector(".jp-Dialog select.jc-input-backend", timeout=30_000)
        backends = page.locator(".jp-Dialog select.jc-input-backend option").evaluate_all("os => os.map(o => o.value)")
        assert backends and backends[0] == "local", backends
        page.fill(".jp-Dialog .jc-input-name", OTHER)
        page.fill(".jp-Dialog .jc-input-workers", "1")
        page.fill(".jp-Dialog .jc-input-memory", "lots")
        page.wait_for_selector(".jp-Dialog .jc-form-error >> text=not a size", timeout=5_000)
        page.fill(".jp-Dialog .jc-input-memory", "1GiB")
        page.fill(".jp-Dialog .jc-input-threads", "1")
        page.click(".jp-Dialog .jp-mod-accept")
        # a card says it is starting while the server starts it (seconds), then the cluster's own
        page.wait_for_selector("#jupyter-cluster-panel .jc-cluster-starting", timeout=10_000)
        page.locator(f'#jupyter-cluster-panel .jc-cluster[data-name="{OTHER}"]').wait_for(timeout=120_000)
        page.wait_for_selector("#jupyter-cluster-panel .jc-cluster-starting", state="detached", timeout=10_000)
        page.wait_for_function(
            f"document.querySelector('#jupyter-cluster-panel .jc-cluster[data-name=\"{OTHER}\"] .jc-cluster-stats')"
            ".textContent.startsWith('1 workers · 1 threads')",
            timeout=30_000,
        )
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
        shot(page, artifacts, "panel-cluster-started.png", "#jupyter-cluster-panel")

        # -- a notebook that attaches to it, maps a cell and reports metrics ------------
        page.goto(f"{lab.url}lab/tree/ui.ipynb", timeout=90_000)
        notebook_ready(page)
        open_panel(page)
        # the panel shows another cluster than the notebook's ...
        page.click(f'#jupyter-cluster-panel .jc-cluster[data-name="{OTHER}"] .jc-cluster-name', timeout=30_000)
        page.wait_for_selector(f'#jupyter-cluster-panel .jc-cluster.jc-selected[data-name="{OTHER}"]', timeout=30_000)
        page.evaluate(RUN_ALL_WHEN_READY_JS)
        # ... and follows the notebook's work to its cluster once the map starts (no click)
        page.wait_for_selector(
            f'#jupyter-cluster-panel .jc-cluster.jc-selected[data-name="{CLUSTER}"]', timeout=120_000
        )
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
        # the job names its notebook and cell, and its link selects that cell (found by the cell's id)
        assert finished.locator(".jc-job-context").inner_text().startswith("ui.ipynb · In [")
        page.evaluate("window.jupyterapp.shell.currentWidget.content.activeCellIndex = 0")
        finished.locator(".jc-job-cell-link").click()
        page.wait_for_function("window.jupyterapp.shell.currentWidget?.content?.activeCellIndex === 2", timeout=10_000)
        # a sweep's job opens its run's table (one row per item) in the main area; closed again
        finished.locator(".jc-job-sweep-link").click()
        page.wait_for_function(
            f"(document.querySelector('.jc-sweep-area .jc-sweep') || {{dataset: {{}}}}).dataset.rows === '{ITEMS}'",
            timeout=30_000,
        )
        page.evaluate("window.jupyterapp.shell.currentWidget.close()")
        page.wait_for_selector(".jc-sweep-area", state="detached", timeout=10_000)

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
        panels = page.locator("#jupyter-cluster-panel .jc-charts .jc-metrics-panel")
        assert panels.count() == 2
        # waits until ECharts has drawn its frame: the line chart's lines, then the heatmap's cells
        _wait_coloured(page, "#jupyter-cluster-panel .jc-charts .jc-metrics-panel", 200, nth=0)
        _wait_coloured(page, "#jupyter-cluster-panel .jc-charts .jc-metrics-panel", 2000, nth=1)
        # every run has its heatmap, all on one colour scale (member 2's cells reach 18, member 0's 6);
        # the index axis is named by the reported key
        heat = page.locator("#jupyter-cluster-panel .jc-metrics-heat").first
        assert heat.get_attribute("data-runs") == "member=0,member=1,member=2"
        assert heat.get_attribute("data-range") == "0,18"
        assert heat.get_attribute("data-axis") == "expert"
        # a difference of two runs on its own scale
        heat.locator("select.jc-diff").select_option(index=1)
        page.wait_for_function(
            "document.querySelector('#jupyter-cluster-panel .jc-metrics-heat').dataset.diff === 'member=0,member=1'",
            timeout=5_000,
        )
        shot(page, artifacts, "panel-heatmaps-shared-scale.png", "#jupyter-cluster-panel .jc-metrics-heat")
        heat.locator("select.jc-diff").select_option(index=0)
        # the topic opens in the main area, as a dockable tab with the same charts
        page.click("#jupyter-cluster-panel .jc-open-topic")
        page.wait_for_function(
            "document.querySelectorAll('.jc-topic-view .jc-metrics-panel canvas').length >= 2", timeout=30_000
        )
        page.wait_for_function(
            "(document.querySelector('.jc-topic-view .jc-metrics-status') || {}).textContent?.includes('48 reports')",
            timeout=30_000,
        )
        _wait_coloured(page, ".jc-topic-view .jc-metrics-panel", 200)  # drawn before the screenshot
        shot(page, artifacts, "main-area-topic.png")
        page.evaluate("window.jupyterapp.commands.execute('application:close')")
        page.wait_for_selector(".jc-topic-view", state="detached", timeout=10_000)
        # tooltips: rounded numbers, short series names
        line = page.locator("#jupyter-cluster-panel .jc-metrics-line").first
        line.scroll_into_view_if_needed()
        box = line.locator("canvas").first.bounding_box()
        page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + box["height"] * 0.4)
        tip = page.wait_for_function(
            "[...document.querySelectorAll('#jupyter-cluster-panel .jc-metrics-line div')]"
            ".map(d => d.innerText || '').find(t => t.startsWith('step ')) || null",
            timeout=10_000,
        ).json_value()
        assert "member 1" in tip and "member=" not in tip, tip
        assert not re.search(r"\d\.\d{5,}", tip), f"unrounded numbers in the tooltip: {tip!r}"
        assert re.match(r"step \d+\n", tip), tip
        page.mouse.move(5, 5)
        # toolbar: EMA smoothing and a log y axis redraw the line chart (and back)
        toolbar = page.locator("#jupyter-cluster-panel .jc-metrics-toolbar")
        toolbar.locator("input.jc-smoothing").fill("0.9")
        toolbar.locator("select.jc-y-scale").select_option("log")
        _wait_coloured(page, "#jupyter-cluster-panel .jc-charts .jc-metrics-panel", 200)
        shot(page, artifacts, "panel-smoothing-log-y.png", "#jupyter-cluster-panel .jc-metrics-line")
        toolbar.locator("input.jc-smoothing").fill("0")
        toolbar.locator("select.jc-y-scale").select_option("linear")
        # series selection: switching a member off redraws without it
        series = page.locator("#jupyter-cluster-panel .jc-series-item")
        assert series.count() == 3
        line = panels.nth(0)
        # member 0's colour (from its key, the same in every chart): drawn, then gone once it is off
        hex0 = line.get_attribute("data-colors").split("|")[0]
        rgb0 = [int(hex0[i : i + 2], 16) for i in (1, 3, 5)]
        blue = line.evaluate(COLOUR_PIXELS_JS, rgb0)
        assert blue > 30, blue
        series.nth(0).locator("input").uncheck()
        assert series.nth(0).locator("input").is_checked() is False
        # the other members keep their colours: nothing is drawn in member 0's blue any more
        page.wait_for_function(
            f"(() => {{ const f = {COLOUR_PIXELS_JS}; "
            f"return f(document.querySelector('#jupyter-cluster-panel .jc-metrics-line'), {rgb0}) < 5; }})()",
            timeout=5_000,
        )
        shot(page, artifacts, "panel-workers-jobs-metrics.png", "#jupyter-cluster-panel")
        shot(page, artifacts, "lab-notebook-and-panel.png")

        # -- the charts follow the sidebar's width: narrow -> wide -> narrow ---------------
        narrow = _chart_fits(page, (150, 320))
        drag_sidebar_to(page, 760)
        wide = _chart_fits(page, (550, 760))
        shot(page, artifacts, "panel-wide.png")
        drag_sidebar_to(page, 300)
        again = _chart_fits(page, (150, 300))
        assert wide > narrow + 250 and again < wide - 250, (narrow, wide, again)
        shot(page, artifacts, "panel-narrow.png", "#jupyter-cluster-panel")

        # -- a theme switch re-styles the charts already drawn ------------------------------
        line = page.locator("#jupyter-cluster-panel .jc-metrics-line").first
        widget = page.locator(".jp-NotebookPanel .jc-metrics-line").first
        assert line.evaluate(TITLE_LIGHT_PIXELS_JS) < 5 and widget.evaluate(TITLE_LIGHT_PIXELS_JS) < 5
        page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Dark'})")
        page.wait_for_function("document.body.dataset.jpThemeLight === 'false'", timeout=30_000)
        # the panel's charts and the notebook widget's charts, drawn before the switch, turn dark
        for where in ("#jupyter-cluster-panel", ".jp-NotebookPanel"):
            page.wait_for_function(
                f"(() => {{ const f = {TITLE_LIGHT_PIXELS_JS}; "
                f"return f(document.querySelector('{where} .jc-metrics-line')) > 40; }})()",
                timeout=10_000,
            )
        # and still fill their boxes
        page.wait_for_function(
            "[...document.querySelectorAll('.jc-metrics-panel')].every(p => "
            "Math.abs(p.querySelector('canvas').getBoundingClientRect().width - p.clientWidth) <= 1)",
            timeout=10_000,
        )
        shot(page, artifacts, "lab-dark-theme.png")
        shot(page, artifacts, "panel-dark.png", "#jupyter-cluster-panel")
        # the "running" badge: dark text on its pastel green (white on it read 1.3:1 in the dark theme)
        badge = page.locator("#jupyter-cluster-panel .jc-status.jc-status-running").first
        assert badge.evaluate("b => getComputedStyle(b).color") == "rgb(27, 94, 32)"
        page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Light'})")
        page.wait_for_function("document.body.dataset.jpThemeLight === 'true'", timeout=30_000)

        # -- notebook widgets follow their cell's width -------------------------------------
        page.set_viewport_size({"width": 900, "height": 1000})
        page.wait_for_function(
            "[...document.querySelectorAll('.jp-NotebookPanel .jc-metrics-panel')].every(p => {"
            " const c = p.querySelector('canvas'); return c && c.getBoundingClientRect().width <= p.clientWidth + 1; })",
            timeout=10_000,
        )
        page.set_viewport_size({"width": 1500, "height": 1000})

        # -- buttons: Connect inserts the magic into the notebook, Scale asks the owner ----
        item.locator(".jc-connect").click()
        page.wait_for_function(
            f"[...document.querySelectorAll('.jp-NotebookPanel .jp-Cell .jp-InputArea-editor')]"
            f".filter(e => e.textContent.includes('%cluster connect {CLUSTER}')).length === 2",
            timeout=15_000,
        )
        item.locator(".jc-scale").click()
        # a bad value keeps the dialog open, says why and keeps what was typed
        page.fill(".jp-Dialog .jc-input-workers", "two")
        page.click(".jp-Dialog .jp-mod-accept")
        page.wait_for_selector(".jp-Dialog .jc-form-error >> text=whole number", timeout=5_000)
        assert page.locator(".jp-Dialog .jc-input-workers").input_value() == "two"
        page.fill(".jp-Dialog .jc-input-workers", "1")
        page.click(".jp-Dialog .jp-mod-accept")
        page.wait_for_function(
            "document.querySelectorAll('#jupyter-cluster-panel .jc-worker').length === 1", timeout=60_000
        )
        page.locator(".jp-NotebookPanel .jp-OutputArea-output").nth(1).scroll_into_view_if_needed()
        shot(page, artifacts, "notebook-widgets.png", ".jp-NotebookPanel")


def test_panel_in_notebook_7(lab, browser, artifacts):
    """The same extension in Notebook 7's notebook page: its left sidebar shows the panel."""
    pytest.importorskip("notebook", minversion="7", reason="Notebook 7 is in the test extras")
    with lab_page(
        browser, lab, "notebooks/ui.ipynb", (1300, 900), artifacts=artifacts, last_shot="notebook7-last-state.png"
    ) as page:
        page.wait_for_selector(".jp-NotebookPanel .jp-Cell", timeout=90_000)
        # reachable without View → Left Sidebar: a button in the notebook's toolbar and an item in the View menu
        page.evaluate("window.jupyterapp.restored")
        button = page.locator('.jp-NotebookPanel-toolbar [data-command="jupyter-cluster:open"]')
        button.wait_for(state="visible", timeout=30_000)
        assert not page.locator("#jupyter-cluster-panel").is_visible()
        button.click()
        page.locator("#jupyter-cluster-panel").wait_for(state="visible", timeout=30_000)
        page.get_by_role("menuitem", name="View").first.click()
        item = page.locator('.lm-Menu-item[data-command="jupyter-cluster:open"]')
        item.wait_for(state="visible", timeout=10_000)
        page.keyboard.press("Escape")
        open_panel(page)
        # the cluster started from JupyterLab's panel is listed here too
        page.click(f'#jupyter-cluster-panel .jc-cluster[data-name="{CLUSTER}"] .jc-cluster-name', timeout=30_000)
        page.wait_for_selector("#jupyter-cluster-panel .jc-worker", timeout=30_000)
        shot(page, artifacts, "notebook7-panel.png")


def test_stopping_a_cluster_keeps_its_jobs_and_curves(lab, browser, artifacts):
    """``%cluster stop`` of the cluster the notebook mapped on: its job and its charts stay, under "Stopped".

    And the server's log shows no traceback for it (its client's cancelled reconnect).
    """
    log_start = os.path.getsize(lab.log_path)
    # the Jupyter server restarts in it: the panel's events socket is refused meanwhile
    refused = "jupyter-cluster/api/events' failed: Error in connection establishment: net::ERR_CONNECTION_REFUSED"
    # and so are its polls (Chromium logs each refused request); the refused Scale of a cluster that
    # does not answer is a 400 (the dialog shows it)
    expected = (refused, "net::ERR_CONNECTION_REFUSED", "/scale?")
    with lab_page(
        browser, lab, "lab", artifacts=artifacts, last_shot="panel-history-last-state.png", expected_errors=expected
    ) as page:
        page.wait_for_selector("#jp-main-dock-panel", timeout=90_000)
        open_panel(page)
        page.click(f'#jupyter-cluster-panel .jc-cluster[data-name="{CLUSTER}"] .jc-cluster-name', timeout=30_000)
        page.wait_for_function(
            "document.querySelectorAll('#jupyter-cluster-panel .jc-metrics-panel canvas').length >= 2", timeout=30_000
        )
        # Stop from the panel, confirmed in the dialog: a cluster with no jobs or metrics just leaves
        page.click(f'#jupyter-cluster-panel .jc-clusters .jc-cluster[data-name="{OTHER}"] .jc-stop')
        page.click(".jp-Dialog .jp-mod-accept")
        page.wait_for_selector(
            f'#jupyter-cluster-panel .jc-cluster[data-name^="{OTHER}"]', state="detached", timeout=60_000
        )
        # %cluster stop from a kernel (this process): the cluster leaves the live list
        import jupyter_cluster as jc

        assert jc.stop(CLUSTER) == CLUSTER
        page.wait_for_selector(
            f'#jupyter-cluster-panel .jc-clusters .jc-cluster[data-name="{CLUSTER}"]', state="detached", timeout=60_000
        )
        # the notebook's attachment to it ("ui-panel-attached-1") is no live cluster either
        page.wait_for_function(
            f"![...document.querySelectorAll('#jupyter-cluster-panel .jc-clusters .jc-cluster')]"
            f".some(e => e.dataset.name.startsWith('{CLUSTER}'))",
            timeout=15_000,
        )
        # ... but its history is kept and stays selected: the job and the curves are still there
        kept = page.locator(
            f'#jupyter-cluster-panel .jc-history .jc-cluster.jc-selected[data-name^="{CLUSTER}.stopped-"]'
        )
        kept.wait_for(timeout=15_000)
        assert "metrics: ui" in kept.inner_text()
        assert page.locator("#jupyter-cluster-panel .jc-job", has_text=f"{ITEMS} / {ITEMS}").count() >= 1
        page.wait_for_function(
            "document.querySelectorAll('#jupyter-cluster-panel .jc-charts .jc-metrics-panel canvas').length >= 2",
            timeout=15_000,
        )
        _wait_coloured(page, "#jupyter-cluster-panel .jc-charts .jc-metrics-panel", 200)
        shot(page, artifacts, "panel-after-stop.png", "#jupyter-cluster-panel")
        # a reload reads the kept history over REST
        page.reload()
        open_panel(page)
        page.click(f'#jupyter-cluster-panel .jc-history .jc-cluster[data-name^="{CLUSTER}.stopped-"] .jc-cluster-name')
        page.wait_for_function(
            f"(document.querySelector('#jupyter-cluster-panel .jc-metrics-status') || {{}}).textContent"
            f"?.includes('{ITEMS} reports')",
            timeout=30_000,
        )
        # a cluster owned by a kernel (this process) whose scheduler goes away before its record
        # (the server's client is reconnecting when the manager closes it), then stopped: quietly
        handle = jc.start(workers=1, threads=1)
        try:
            page.wait_for_selector(
                f'#jupyter-cluster-panel .jc-clusters .jc-cluster[data-name="{handle.name}"] .jc-status-running',
                timeout=30_000,
            )
            handle.client.shutdown()
            page.wait_for_selector(
                f'#jupyter-cluster-panel .jc-clusters .jc-cluster[data-name="{handle.name}"] .jc-status-unreachable',
                timeout=30_000,
            )
            # the server's refusal to scale it comes back inside the dialog, with what was typed
            page.click(f'#jupyter-cluster-panel .jc-clusters .jc-cluster[data-name="{handle.name}"] .jc-scale')
            page.fill(".jp-Dialog .jc-input-workers", "3")
            page.click(".jp-Dialog .jp-mod-accept")
            page.wait_for_selector(".jp-Dialog .jc-form-error >> text=does not answer", timeout=15_000)
            assert page.locator(".jp-Dialog .jc-input-workers").input_value() == "3"
            shot(page, artifacts, "dialog-server-refusal.png", ".jp-Dialog-content")
            page.click(".jp-Dialog .jp-mod-reject")
            page.wait_for_selector(".jp-Dialog", state="detached", timeout=5_000)
        finally:
            jc.stop(handle.name)
        page.wait_for_selector(
            f'#jupyter-cluster-panel .jc-clusters .jc-cluster[data-name="{handle.name}"]',
            state="detached",
            timeout=30_000,
        )
        # no traceback in the server's log for these expected events
        with open(lab.log_path, errors="replace") as f:
            f.seek(log_start)
            log = f.read()
        assert "Traceback" not in log and "ConnectionRefusedError" not in log, log[-3000:]
        # a server restart keeps the history (on disk in Jupyter's runtime area)
        kept_dir = os.path.join(os.environ["JUPYTER_RUNTIME_DIR"], "jupyter-cluster-history")
        assert any(n.startswith(f"{CLUSTER}.stopped-") for n in os.listdir(kept_dir))
        lab.stop()
        lab.start(timeout=120)
        page.reload()
        open_panel(page)
        page.click(
            f'#jupyter-cluster-panel .jc-history .jc-cluster[data-name^="{CLUSTER}.stopped-"] .jc-cluster-name',
            timeout=60_000,
        )
        page.wait_for_function(
            f"(document.querySelector('#jupyter-cluster-panel .jc-metrics-status') || {{}}).textContent"
            f"?.includes('{ITEMS} reports')",
            timeout=30_000,
        )
        page.wait_for_function(
            "document.querySelectorAll('#jupyter-cluster-panel .jc-charts .jc-metrics-panel canvas').length >= 2",
            timeout=15_000,
        )
        assert page.locator("#jupyter-cluster-panel .jc-job", has_text=f"{ITEMS} / {ITEMS}").count() >= 1
        shot(page, artifacts, "panel-after-server-restart.png", "#jupyter-cluster-panel")
        # Forget deletes the kept history, on disk too
        page.locator(
            f'#jupyter-cluster-panel .jc-history .jc-cluster[data-name^="{CLUSTER}.stopped-"] .jc-forget'
        ).click()
        page.wait_for_selector(
            f'#jupyter-cluster-panel .jc-history .jc-cluster[data-name^="{CLUSTER}.stopped-"]',
            state="detached",
            timeout=15_000,
        )
        assert not any(n.startswith(f"{CLUSTER}.stopped-") for n in os.listdir(kept_dir))
