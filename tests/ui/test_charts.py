"""Charts a researcher reads at a glance, in a real JupyterLab with a real kernel (no cluster needed).

The notebook reports from the kernel itself: three random walks (walk 0
never above 0), a second value of the same walks, and 60 members of a
population.  In the browser: log y says what it dropped and symlog draws
everything; a series has one colour in every chart; the smoothing slider's
tooltip shows smoothed and raw values; 60 series get no legend but a
tooltip of the series nearest the pointer, and top-k keeps the best five;
a push that changes one value redraws only that chart; the dark theme
re-styles the toolbar and switches to the light-on-dark palette, in the
charts and in a sweep table's swatches and parallel coordinates.
Screenshots go to test-artifacts/charts-*.png.
"""

from __future__ import annotations

import json
import os

import nbformat
import pytest

from .pages import EXECUTE_JS, RUN_ALL_WHEN_READY_JS, lab_page, notebook_ready, shot

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

STEPS = 40
MEMBERS = 60

NOTEBOOK_CELLS = [
    "import jupyter_cluster as jc",
    f"""for s in range({STEPS}):
    for w in range(3):
        # walk 0 stays at or below 0: a log axis cannot draw any of it
        jc.report(step=s, topic="walks", walk=f"walk {{w}}", position=-s - 1 if w == 0 else (s + 1) * w,
                  speed=w + 0.01 * s)
    for m in range({MEMBERS}):
        jc.report(step=s, topic="pop", member=m, reward=m + 0.01 * s)""",
    'jc.show_metrics("walks")',
    'jc.show_metrics("pop")',
    # a fixed sweep table (no cluster): its row swatches and parallel coordinates follow the theme
    'jc.show_runs([dict(run="r1", key=f"lr={lr}", name=f"lr={lr}", config=dict(lr=lr), final=dict(loss=1 / lr),'
    " best=dict(loss=1 / lr)) for lr in (1, 2, 3)])",
]
SWATCHES_JS = "[...document.querySelectorAll('.jp-OutputArea .jc-sweep .jc-swatch')].map(s => s.style.background)"

WALKS = ".jp-OutputArea .jc-metrics >> nth=0"
POP = ".jp-OutputArea .jc-metrics >> nth=1"


def _chart(nth: int, value: str) -> str:
    return f"document.querySelectorAll('.jp-OutputArea .jc-metrics')[{nth}]?.querySelector('.jc-metrics-line[data-value=\"{value}\"]')"


def _wait(page, expr: str, timeout: float = 15_000) -> None:
    page.wait_for_function(
        f"(() => {{ try {{ return !!({expr}); }} catch (e) {{ return false; }} }})()", timeout=timeout
    )


def _tooltip(page, nth: int, value: str, fx: float, fy: float) -> str:
    """Hover the chart at (fx, fy) of its size; the tooltip's text."""
    line = page.locator(".jp-OutputArea .jc-metrics").nth(nth).locator(f'.jc-metrics-line[data-value="{value}"]')
    line.scroll_into_view_if_needed()
    box = line.locator("canvas").first.bounding_box()
    page.mouse.move(box["x"] + box["width"] * fx, box["y"] + box["height"] * fy)
    tip = page.wait_for_function(
        f"[...{_chart(nth, value)}.querySelectorAll('div')].map(d => d.innerText || '')"
        ".find(t => t.startsWith('step ')) || null",
        timeout=10_000,
    ).json_value()
    page.mouse.move(2, 2)
    return tip


def test_charts_read_at_a_glance(lab, browser, artifacts):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in NOTEBOOK_CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, os.path.join(lab.root_dir, "charts.ipynb"))
    with lab_page(
        browser, lab, "lab/tree/charts.ipynb", artifacts=artifacts, last_shot="charts-last-state.png"
    ) as page:
        notebook_ready(page)
        page.evaluate(RUN_ALL_WHEN_READY_JS)
        _wait(page, f"{_chart(0, 'position')}.dataset.series.split('|').length === 3", timeout=120_000)
        _wait(page, f"{_chart(1, 'reward')}.dataset.series.split('|').length === {MEMBERS}", timeout=60_000)
        _wait(page, "document.querySelector('.jp-OutputArea .jc-sweep')?.dataset.rows === '3'", timeout=60_000)
        walks = page.locator(WALKS)

        # -- one colour per series, in every chart of the topic --------------------------------------------
        colors = page.evaluate(f"[{_chart(0, 'position')}.dataset.colors, {_chart(0, 'speed')}.dataset.colors]")
        assert colors[0] == colors[1] and len(set(colors[0].split("|"))) == 3, colors

        # -- log y says what it dropped; symlog draws it all ------------------------------------------------
        walks.locator("select.jc-y-scale").select_option("log")
        _wait(page, f"{_chart(0, 'position')}.dataset.yScale === 'log'")
        notice = page.evaluate(f"{_chart(0, 'position')}.dataset.notice")
        assert f"walk 0: all {STEPS}" in notice and f"{STEPS} points ≤ 0 not drawn" in notice, notice
        assert page.evaluate(f"{_chart(0, 'position')}.dataset.logDropped") == str(STEPS)
        shot(page, artifacts, "charts-log-y-dropped.png", f"{WALKS} >> .jc-metrics-line >> nth=0")
        walks.locator("select.jc-y-scale").select_option("symlog")
        _wait(page, f"{_chart(0, 'position')}.dataset.yScale === 'symlog'")
        assert page.evaluate(f"{_chart(0, 'position')}.dataset.notice") == ""
        shot(page, artifacts, "charts-symlog.png", f"{WALKS} >> .jc-metrics-line >> nth=0")
        walks.locator("select.jc-y-scale").select_option("linear")

        # -- the smoothing slider: smoothed and raw values in the tooltip ----------------------------------
        walks.locator("input.jc-smoothing").fill("0.6")
        _wait(page, f"JSON.parse({_chart(0, 'speed')}.dataset.draws) >= 1")
        tip = _tooltip(page, 0, "speed", 0.5, 0.5)
        assert "(raw " in tip, tip
        walks.locator("input.jc-smoothing").fill("0")

        # -- 60 series: no legend, the tooltip lists those nearest the pointer; top-k --------------------------
        assert page.evaluate(f"{_chart(1, 'reward')}.dataset.legend") == "false"
        tip = _tooltip(page, 1, "reward", 0.5, 0.5)
        rows = tip.strip().split("\n")
        assert len(rows) <= 10 and "further from the pointer" in rows[-1], tip
        # nearest the middle of the y range: members around 30, not the top ones
        shown = [int(r.split("member ")[1].split(":")[0]) for r in rows[1:-1]]
        assert all(15 < m < 45 for m in shown), tip
        pop = page.locator(POP)
        pop.locator("select.jc-top-k").select_option("top5")
        _wait(page, f"{_chart(1, 'reward')}.dataset.series.split('|').length === 5")
        series = page.evaluate(f"{_chart(1, 'reward')}.dataset.series").split("|")
        assert series == [f"member={m}" for m in range(MEMBERS - 5, MEMBERS)], series
        assert page.evaluate(f"{_chart(1, 'reward')}.dataset.notice") == f"top 5 of {MEMBERS} by last value"
        _wait(page, f"{_chart(1, 'reward')}.dataset.legend === 'true'")
        shot(page, artifacts, "charts-top-k.png", f"{POP} >> .jc-metrics-line >> nth=0")

        # -- a push that changes one value redraws that chart only ---------------------------------------------
        # The report comes from a timer in the kernel, after the cell that starts it has ended: a cell's end
        # re-renders its displayed widgets (their static copies are updated), a report alone must not redraw.
        walks.scroll_into_view_if_needed()
        page.evaluate(
            EXECUTE_JS,
            'import threading\nthreading.Timer(4.0, lambda: jc.report(step=999, topic="walks", walk="walk 1", speed=5.0))'
            ".start()",
        )
        page.wait_for_timeout(1500)  # the cell's end has re-rendered the widgets by now
        before = page.evaluate(f"[{_chart(0, 'position')}.dataset.draws, {_chart(0, 'speed')}.dataset.draws]")
        _wait(page, f"{_chart(0, 'speed')}.dataset.xRange.endsWith(',999')", timeout=20_000)
        page.wait_for_timeout(1500)  # a few more pushes' worth of time: the position chart must stay as it was
        after = page.evaluate(f"[{_chart(0, 'position')}.dataset.draws, {_chart(0, 'speed')}.dataset.draws]")
        assert after[0] == before[0] and int(after[1]) > int(before[1]), (before, after)

        # -- a cell's end re-renders the output (its static copy is updated): the toolbar's choices stay -----------
        walks.locator("select.jc-y-scale").select_option("symlog")
        walks.locator("input.jc-smoothing").fill("0.8")
        page.evaluate("document.querySelector('.jp-OutputArea .jc-metrics').dataset.old = 'yes'")
        page.evaluate(
            EXECUTE_JS, 'import time\njc.report(step=50, topic="walks", walk="walk 2", speed=1.0)\ntime.sleep(1.5)'
        )
        _wait(page, "document.querySelector('.jp-OutputArea .jc-metrics').dataset.old !== 'yes'", timeout=30_000)
        _wait(page, f"{_chart(0, 'position')}.dataset.yScale === 'symlog'")
        assert walks.locator("select.jc-y-scale").input_value() == "symlog"
        assert walks.locator("input.jc-smoothing").input_value() == "0.8"
        walks.locator("select.jc-y-scale").select_option("linear")
        walks.locator("input.jc-smoothing").fill("0")

        # -- the dark theme: the toolbar, the series colours and the sweep's swatches change with it -------------
        light_swatches = page.evaluate(SWATCHES_JS)
        assert len(set(light_swatches)) == 3, light_swatches
        light_json = json.dumps(json.dumps(light_swatches, separators=(",", ":")))  # as JSON.stringify writes it
        page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', { theme: 'JupyterLab Dark' })")
        _wait(page, "document.querySelector('.jp-OutputArea .jc-metrics').dataset.theme === 'dark'", timeout=30_000)
        _wait(page, f"{_chart(0, 'position')}.dataset.colors !== {colors[0]!r}")
        for button in ("button.jc-export-csv", "button.jc-copy-code"):
            background = walks.locator(button).evaluate("b => getComputedStyle(b).backgroundColor")
            rgb = [int(x) for x in background[background.index("(") + 1 : background.index(")")].split(",")[:3]]
            assert sum(rgb) / 3 < 100, (button, background)
        shot(page, artifacts, "charts-dark.png", WALKS)
        # the sweep table's swatches and parallel coordinates are drawn again in the dark palette
        _wait(page, f"JSON.stringify({SWATCHES_JS}) !== {light_json}")
        dark_swatches = page.evaluate(SWATCHES_JS)
        assert len(set(dark_swatches)) == 3, dark_swatches
        _wait(page, "document.querySelector('.jp-OutputArea .jc-sweep-parallel').dataset.scale.startsWith('#7b6fd6')")
        shot(page, artifacts, "charts-sweep-dark.png", ".jp-OutputArea .jc-sweep")
        page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', { theme: 'JupyterLab Light' })")
        _wait(page, "document.querySelector('.jp-OutputArea .jc-metrics').dataset.theme === 'light'", timeout=30_000)
        _wait(page, f"JSON.stringify({SWATCHES_JS}) === {light_json}")
