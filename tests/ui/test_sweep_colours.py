"""One colour per sweep item, in a real JupyterLab: the sweep table's swatch is the item's series colour.

A 5-item ``%%parallel`` sweep on a real cluster reports ``trial=<i>`` curves to
one topic, beside a series that is no sweep item (``run=baseline``, reported
from the notebook), so the colours are assigned over the topic's keys and not
over the table's rows.  In the browser each row's swatch (and its line in the
parallel coordinates) must be the colour its series ``trial=<i>`` has in the
topic's metrics chart.  Screenshot: test-artifacts/sweep-colours.png.
"""

from __future__ import annotations

import os

import nbformat
import pytest

from .pages import RUN_ALL_WHEN_READY_JS, lab_page, notebook_ready, shot

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

ITEMS = 5

NOTEBOOK_CELLS = [
    "import jupyter_cluster as jc\n%load_ext jupyter_cluster\n%cluster start --name ui-colours --workers 1 --threads 1",
    "for s in range(3):\n    jc.report(step=s, topic='colours', run='baseline', loss=1.0)",
    f"""%%parallel cfg in [{{'trial': i, 'lr': 0.1 * (i + 1)}} for i in range({ITEMS})]
import jupyter_cluster as jc
for step in range(3):
    jc.report(step=step, topic='colours', trial=cfg['trial'], loss=cfg['lr'] * (3 - step))""",
    "jc.show_metrics('colours')",
    "jc.show_runs(topic='colours')",
]

CHART = "document.querySelector('.jp-OutputArea .jc-metrics .jc-metrics-line[data-value=\"loss\"]')"

# each row's trial, its swatch's computed colour and its parallel line's colour; and the chart's series colours
READ_JS = f"""() => {{
  const hex = h => 'rgb(' + [1, 3, 5].map(i => parseInt(h.slice(i, i + 2), 16)).join(', ') + ')';
  const chart = {CHART};
  const series = chart.dataset.series.split('|');
  const colors = chart.dataset.colors.split('|');
  const box = document.querySelector('.jp-OutputArea .jc-sweep-parallel');
  const lines = (box.dataset.colors || '').split('|');
  const rows = [...document.querySelectorAll('.jp-OutputArea .jc-sweep tr.jc-sweep-row')];
  return {{
    chart: Object.fromEntries(series.map((k, i) => [k, hex(colors[i])])),
    rows: rows.map((tr, i) => ({{
      id: tr.dataset.id,
      swatch: getComputedStyle(tr.querySelector('.jc-swatch')).backgroundColor,
      line: lines[i] ? hex(lines[i]) : null
    }}))
  }};
}}"""


def test_a_sweep_rows_swatch_is_its_items_series_colour_in_the_metrics_chart(lab, browser, artifacts):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in NOTEBOOK_CELLS]
    nb.cells.append(nbformat.v4.new_code_cell("%cluster stop ui-colours"))
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, os.path.join(lab.root_dir, "colours.ipynb"))
    with lab_page(
        browser, lab, "lab/tree/colours.ipynb", artifacts=artifacts, last_shot="sweep-colours-last.png"
    ) as page:
        notebook_ready(page)
        page.evaluate(RUN_ALL_WHEN_READY_JS)
        page.wait_for_function(
            f"(() => {{ try {{ return {CHART}.dataset.series.split('|').length === {ITEMS + 1}"
            f" && document.querySelector('.jp-OutputArea .jc-sweep').dataset.rows === '{ITEMS}'"
            f" && document.querySelector('.jp-OutputArea .jc-sweep-parallel').dataset.lines === '{ITEMS}'; }}"
            " catch (e) { return false; } })()",
            timeout=180_000,
        )
        seen = page.evaluate(READ_JS)
        chart, rows = seen["chart"], seen["rows"]
        assert sorted(chart) == sorted(["run=baseline", *(f"trial={i}" for i in range(ITEMS))]), chart
        assert len(rows) == ITEMS, rows
        for row in rows:
            # the row's id is "<run>:<item key>", its key "lr=..., trial=<i>": its series in the chart is trial=<i>
            trial = row["id"].rsplit("trial=", 1)[1]
            want = chart[f"trial={trial}"]
            assert row["swatch"] == want and row["line"] == want, (row, chart)
        assert len({row["swatch"] for row in rows}) == ITEMS  # and no two items share a colour
        page.locator(".jp-OutputArea .jc-sweep").first.scroll_into_view_if_needed()
        shot(page, artifacts, "sweep-colours.png", ".jp-OutputArea .jc-sweep >> nth=0")
