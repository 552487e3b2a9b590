"""A SLURM cluster's worker table in the panel: no two cells overlap and no text is cut, narrow or widened.

A real Dask scheduler with three workers named as dask-jobqueue names them
(``SLURMCluster-<n>``) stands in for a SLURM cluster: its owner process keeps
the batch facts in the scheduler's metadata, as ``backends/jobqueue/facts.py``'s
poller does from ``squeue`` (job id, node, walltime left; a pending job), and
registers it as a ``slurm`` cluster.  The Jupyter server reads the facts into the
cluster's view, so the panel draws the three batch columns (job, node, left)
beside the six usual ones.  At the sidebar's default width and widened, every
cell of the header and of each row must keep to its own box (no two boxes of a
row overlap, none leaves its row) and show its whole text.  Screenshots:
test-artifacts/slurm-workers-{default,wide}.png.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from ..conftest import wait_for
from .pages import drag_sidebar_to, lab_page, open_panel, shot

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(240)]

NAME = "ui-slurm"
PANEL = "#jupyter-cluster-panel"

OWNER = textwrap.dedent(
    """
    import asyncio, os, sys, time
    from distributed import Scheduler, Worker
    from jupyter_cluster.backends.jobqueue.facts import FACTS_KEY
    from jupyter_cluster.state import registry

    async def main(name, stop_file):
        async with Scheduler(host="127.0.0.1", port=0, dashboard_address=None) as s:
            workers = [Worker(s.address, name=f"SLURMCluster-{i}", nthreads=1) for i in (0, 1, 12)]
            await asyncio.gather(*workers)
            jobs = [
                {"job_id": f"{4711230 + i}", "state": "RUNNING", "node": f"gpu-a100-node{17 + i:03d}",
                 "walltime_left": "1-23:45:12", "worker": f"SLURMCluster-{i}"}
                for i in (0, 1, 12)
            ]
            jobs.append({"job_id": "4711299", "state": "PENDING", "reason": "Resources"})
            s.set_metadata(keys=list(FACTS_KEY), value={"system": "slurm", "updated": time.time(), "jobs": jobs})
            registry.write(registry.ClusterRecord(
                name=name, backend="slurm", address=s.address, owner_kind="process",
                extra={"batch": {"system": "slurm", "job_name": name}},
            ))
            print("ready", flush=True)
            try:
                while not os.path.exists(stop_file):
                    await asyncio.sleep(0.2)
            finally:
                registry.remove(name)
                await asyncio.gather(*(w.close() for w in workers))

    asyncio.run(main(sys.argv[1], sys.argv[2]))
    """
)

# For the header and each drawn row: its cells' boxes (x range, y range), the row's box, and whether
# each cell's text is cut (its content wider than its box; the memory cell's text, beside its bar).
MEASURE_JS = f"""() => {{
  const list = document.querySelector('{PANEL} .jc-worker-list');
  const rows = [list.querySelector('.jc-worker-header'), ...list.querySelectorAll('.jc-worker')];
  return rows.map(row => {{
    const r = row.getBoundingClientRect();
    return {{
      row: [r.left, r.right, r.top, r.bottom],
      cells: [...row.children].map(c => {{
        const b = c.getBoundingClientRect();
        const text = c.classList.contains('jc-memory') ? c.querySelector('.jc-bar-text') : c;
        const range = document.createRange();
        range.selectNodeContents(text);
        const inner = range.getBoundingClientRect();
        return {{
          cls: c.className, text: c.textContent,
          box: [b.left, b.right, b.top, b.bottom],
          cut: text.scrollWidth > text.clientWidth + 1 || (c.textContent !== '' && inner.right > b.right + 0.5),
        }};
      }})
    }};
  }});
}}"""


def _problems(rows: list[dict]) -> list[str]:
    out = []
    for i, row in enumerate(rows):
        top, bottom = row["row"][2], row["row"][3]
        cells = row["cells"]
        for c in cells:
            if c["cut"]:
                out.append(f"row {i}: {c['cls']} {c['text']!r} is cut")
            if c["box"][2] < top - 0.5 or c["box"][3] > bottom + 0.5:
                out.append(f"row {i}: {c['cls']} {c['text']!r} leaves its row")
        for a in range(len(cells)):
            for b in range(a + 1, len(cells)):
                x, y = cells[a]["box"], cells[b]["box"]
                if x[0] < y[1] - 0.5 and y[0] < x[1] - 0.5 and x[2] < y[3] - 0.5 and y[2] < x[3] - 0.5:
                    out.append(
                        f"row {i}: {cells[a]['cls']} {cells[a]['text']!r} overlaps {cells[b]['cls']} {cells[b]['text']!r}"
                    )
    return out


def test_a_slurm_clusters_worker_table_has_no_overlapping_or_cut_cells_at_two_widths(lab, browser, artifacts, tmp_path):
    stop = tmp_path / "stop"
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    owner = subprocess.Popen([sys.executable, "-c", OWNER, NAME, str(stop)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None and owner.stdout.readline().strip() == "ready"
        with lab_page(browser, lab, "lab", artifacts=artifacts, last_shot="slurm-workers-last.png") as page:
            page.wait_for_selector("#jp-main-dock-panel", timeout=90_000)
            open_panel(page)
            page.click(f'{PANEL} .jc-cluster[data-name="{NAME}"] .jc-cluster-name', timeout=60_000)
            # the batch columns, filled from the facts: three rows with their job id, node and time left
            page.wait_for_function(
                f"""() => {{
                  const rows = [...document.querySelectorAll('{PANEL} .jc-worker')];
                  return rows.length === 3 && rows.every(r => r.querySelectorAll('.jc-worker-batch').length === 3
                    && [...r.querySelectorAll('.jc-worker-batch')].every(c => c.textContent));
                }}""",
                timeout=60_000,
            )
            labels = page.locator(f"{PANEL} .jc-worker-header > *").all_inner_texts()
            assert labels[-3:] == ["job", "node", "left"], labels
            page.wait_for_timeout(300)
            widths = {}
            for label, x in (("default", None), ("wide", 900)):
                if x is not None:
                    drag_sidebar_to(page, x)
                    page.wait_for_timeout(600)
                widths[label] = page.locator(PANEL).bounding_box()["width"]
                page.locator(f"{PANEL} .jc-worker-list").scroll_into_view_if_needed()
                problems = _problems(page.evaluate(MEASURE_JS))
                # what does not fit the sidebar is reached by scrolling the list sideways, not cut off
                scroll = page.locator(f"{PANEL} .jc-worker-list").evaluate(
                    "l => [l.scrollWidth, l.clientWidth, getComputedStyle(l).overflowX]"
                )
                assert scroll[2] == "auto" and (label == "wide" or scroll[0] > scroll[1]), (label, scroll)
                if label == "wide":
                    assert scroll[0] <= scroll[1] + 1, scroll  # widened: the whole table fits
                shot(page, artifacts, f"slurm-workers-{label}.png", f"{PANEL} .jc-workers-section")
                assert not problems, (label, widths[label], problems)
            assert widths["wide"] > widths["default"] + 300, widths
    finally:
        stop.touch()
        try:
            owner.wait(timeout=30)
        except subprocess.TimeoutExpired:
            owner.kill()
            owner.wait()
        wait_for(lambda: owner.poll() is not None, 5, message="the stand-in SLURM owner to exit")
