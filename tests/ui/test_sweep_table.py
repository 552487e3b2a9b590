"""The sweep table answers "which config is best": a fixed 30-row lr x aux x seed table, no cluster (fast).

Grouping by lr and aux gives 10 collapsed rows of n = 3 with mean ± sd, that
expand to their runs; the lr axis is logarithmic; brushing lr to 1e-3 in the
parallel coordinates leaves 6 rows; the first click on loss puts the lowest
first; the filter's placeholder matches rows and an unknown key is named;
hovering a row marks it; ticked rows stand out; each metric's best run is
marked; the axis switch puts lr on a linear scale and back.  Light and dark
screenshots go to test-artifacts/sweep-review-*.png.
"""

from __future__ import annotations

import os

import nbformat
import pytest

from .pages import RUN_ALL_WHEN_READY_JS, lab_page, notebook_ready, shot

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]

ROWS = """rows = []
for lr in (1e-4, 3e-4, 1e-3, 3e-3, 1e-2):
    for aux in (True, False):
        for seed in (0, 1, 2):
            loss = 1 / (1 + 100 * lr) + (0 if aux else 0.1) + seed * 0.01
            key = f"lr={lr}, aux={aux}, seed={seed}"
            rows.append(dict(run="r1", key=key, name=key, state="finished", config=dict(lr=lr, aux=aux, seed=seed),
                             final=dict(acc=1 - loss, loss=loss), best=dict(acc=1 - loss, loss=loss)))
jc.show_runs(rows)"""

SWEEP = ".jp-OutputArea .jc-sweep"


def _wait(page, js: str, timeout: float = 15_000) -> None:
    page.wait_for_function(
        f"(() => {{ const s = document.querySelector({SWEEP!r}); return !!s && ({js}); }})()", timeout=timeout
    )


def test_the_sweep_table_groups_brushes_and_says_which_is_best(lab, browser, artifacts):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import jupyter_cluster as jc"), nbformat.v4.new_code_cell(ROWS)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, os.path.join(lab.root_dir, "review.ipynb"))
    with lab_page(
        browser, lab, "lab/tree/review.ipynb", artifacts=artifacts, last_shot="sweep-review-last.png"
    ) as page:
        notebook_ready(page)
        page.evaluate(RUN_ALL_WHEN_READY_JS, False)
        _wait(page, "s.dataset.rows === '30'", timeout=120_000)
        sweep = page.locator(SWEEP).first
        sweep.scroll_into_view_if_needed()

        # the metric is the loss (not the alphabetically first acc); lr is on a log axis, aux and seed categories
        assert sweep.locator("select.jc-sweep-metric").input_value() == "loss"
        _wait(page, "(s.querySelector('.jc-sweep-parallel')?.dataset.axes ?? '').length > 0")
        axes = sweep.locator(".jc-sweep-parallel").get_attribute("data-axes").split("|")
        assert axes == ["lr:log", "aux:category", "seed:category", "loss:linear"], axes
        # the best run of each metric is marked: the lowest final loss, the highest final accuracy (one run here)
        best_id = "r1:lr=0.01, aux=True, seed=0"
        best = sweep.locator("table.jc-sweep-table").get_attribute("data-best").split("|")
        assert sorted(best) == [f"acc:{best_id}", f"loss:{best_id}"], best
        marked = sweep.locator(f'tr.jc-sweep-row[data-id="{best_id}"] td.jc-sweep-best')
        assert marked.count() == 2 and "★" in marked.first.inner_text()
        # the axis switch: lr to linear and back to log; seed offers no log (it has a 0)
        sweep.locator("select.jc-sweep-axis").select_option("lr")
        kinds = sweep.locator("select.jc-sweep-axis-kind")
        assert kinds.input_value() == "log"
        kinds.select_option("linear")
        _wait(page, "s.querySelector('.jc-sweep-parallel').dataset.axes.startsWith('lr:linear|')")
        kinds.select_option("log")
        _wait(page, "s.querySelector('.jc-sweep-parallel').dataset.axes.startsWith('lr:log|')")
        sweep.locator("select.jc-sweep-axis").select_option("seed")
        offered = kinds.locator("option").evaluate_all("os => os.map(o => o.value)")
        assert offered == ["linear", "category"], offered
        kinds.select_option("linear")
        _wait(page, "s.querySelector('.jc-sweep-parallel').dataset.axes.includes('seed:linear')")
        kinds.select_option("category")
        _wait(page, "s.querySelector('.jc-sweep-parallel').dataset.axes.includes('seed:category')")
        shot(page, artifacts, "sweep-review-light.png", SWEEP)

        # the first click on loss: the best (lowest) first
        sweep.locator('th[data-col="final:loss"]').click()
        _wait(page, "s.dataset.order.split('|')[0] === 'r1:lr=0.01, aux=True, seed=0'")

        # the filter's own example matches rows; an unknown key is named, not an empty table
        box = sweep.locator("input.jc-sweep-filter")
        example = box.get_attribute("placeholder").removeprefix("filter: ")
        box.fill(example)
        _wait(page, "Number(s.dataset.rows) > 0 && Number(s.dataset.rows) < 30")
        box.fill("lrr>0.01")
        _wait(page, "s.dataset.filterProblem.includes(`no column 'lrr'`)")
        assert sweep.locator(".jc-sweep-filter-problem").is_visible() and sweep.get_attribute("data-rows") == "30"
        box.fill("aux=on")
        _wait(page, "s.dataset.rows === '15'")
        box.fill("")
        _wait(page, "s.dataset.rows === '30'")

        # brushing lr to 1e-3 in the parallel coordinates leaves its 6 rows
        page.evaluate(f"document.querySelector({SWEEP!r}).jcSweepView.brush('lr', [0.0008, 0.0012])")
        _wait(page, "s.dataset.rows === '6'")
        assert all("lr=0.001," in r for r in sweep.get_attribute("data-order").split("|"))
        page.evaluate(f"document.querySelector({SWEEP!r}).jcSweepView.brush('lr', [0.00001, 1])")
        _wait(page, "s.dataset.rows === '30'")

        # hovering a row marks it; a ticked row stands out
        first = sweep.locator("tr.jc-sweep-row").first
        first.hover()
        _wait(page, "s.dataset.hovered === " + repr(first.get_attribute("data-id")))
        first.locator("input[type=checkbox]").check()
        _wait(page, "!!s.querySelector('tr.jc-sweep-ticked')")

        # grouped by lr and aux: 10 collapsed rows of n = 3 with mean ± sd, expanding to their runs
        sweep.locator("select.jc-sweep-group").select_option("lr")
        sweep.locator("select.jc-sweep-group2").select_option("aux")
        _wait(page, "s.querySelectorAll('tr.jc-sweep-group-row').length === 10")
        groups = sweep.locator("tr.jc-sweep-group-row")
        assert {groups.nth(i).get_attribute("data-n") for i in range(10)} == {"3"}
        assert sweep.locator("tr.jc-sweep-row").count() == 0
        labels = [groups.nth(i).get_attribute("data-group") for i in range(3)]
        assert labels == ["lr=1e-4, aux=false", "lr=1e-4, aux=true", "lr=3e-4, aux=false"], labels
        mean = groups.first.locator("td.jc-sweep-mean").first.inner_text()
        assert "±" in mean, mean
        groups.nth(1).click()
        _wait(page, "s.querySelectorAll('tr.jc-sweep-row').length === 3")
        shot(page, artifacts, "sweep-review-grouped-light.png", SWEEP)
        page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', { theme: 'JupyterLab Dark' })")
        _wait(page, "s.dataset.theme === 'dark'", timeout=30_000)
        page.wait_for_timeout(300)
        shot(page, artifacts, "sweep-review-grouped-dark.png", SWEEP)
        sweep.locator("select.jc-sweep-group").select_option("")
        _wait(page, "s.querySelectorAll('tr.jc-sweep-group-row').length === 0")
        page.wait_for_timeout(300)
        shot(page, artifacts, "sweep-review-dark.png", SWEEP)
        page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', { theme: 'JupyterLab Light' })")
        _wait(page, "s.dataset.theme === 'light'", timeout=30_000)
