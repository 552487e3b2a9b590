"""What finished sweeps leave in the kernel (issue 37): the scheduler's jobs log keeps a bounded number of items.

A local cluster's scheduler runs in the kernel, and Dask keeps the last 1,000
events of every topic: with each finished ``%%parallel`` job's full item list,
300 sweeps of 2,000 items grew the kernel from 107 to 1,130 MiB (602,000 items
kept).  The log now keeps :data:`~jupyter_cluster.telemetry.job_log.KEEP_LOG_ITEMS`
items, the newest sweeps'; the kernel's own record (``jc.runs()``) is unchanged.
"""

from __future__ import annotations

from jupyter_cluster import mapping
from jupyter_cluster.telemetry.job_log import KEEP_LOG_ITEMS
from jupyter_cluster.telemetry.topic_names import JOBS_TOPIC

from ..conftest import wait_for

CELLS = 40  # 80,000 items: four times what the log keeps
ITEMS = 2000


def _items_kept(client) -> tuple[int, list]:
    events = client.get_events(JOBS_TOPIC)
    with_items = [m for _, m in events if isinstance(m, dict) and m.get("items")]
    return sum(len(m["items"]) for m in with_items), with_items


def test_the_jobs_log_keeps_a_bounded_number_of_sweep_items(ip, cluster):
    ids = []
    for _ in range(CELLS):
        # a sweep (--sweep): a map over plain numbers lists no items
        ip.run_cell_magic("parallel", f"x in range({ITEMS}) --sweep --no-progress", "y = x + 1\n")
        ids.append(mapping.last_job().id)
    # The last job's final message reaches the scheduler just after the cell returns.
    wait_for(lambda: ids[-1] in {m.get("job") for m in _items_kept(cluster.client)[1]}, timeout=20,
             message="the last sweep's items in the scheduler's log")  # fmt: skip
    kept, messages = _items_kept(cluster.client)
    assert kept <= KEEP_LOG_ITEMS, f"the scheduler's jobs log keeps {kept} items of {CELLS} sweeps"
    newest = messages[-1]
    assert newest["job"] == ids[-1] and len(newest["items"]) == ITEMS and newest["item_count"] == ITEMS
    # The older messages are all still there, without their item lists but with their counts.
    finals = {m.get("job"): m for _, m in cluster.client.get_events(JOBS_TOPIC) if m.get("state") == "finished"}
    assert set(ids) <= set(finals) and all(finals[i].get("item_count") == ITEMS for i in ids)
