"""The events socket's worker feed: the full list once, then changes only, none while idle.

The diffing is plain data (:class:`WorkerFeed`); the lease count is checked
against a real cluster whose map's leases linger after it.
"""

from __future__ import annotations

import pytest

from jupyter_cluster.server.workers import LEASE_PREFIX, WorkerFeed, lease_counts, significant, split_leases

from .conftest import wait_for

pytestmark = pytest.mark.timeout(120)

GIB = 2**30


def worker(i: int, **kw) -> dict:
    row = {
        "name": str(i),
        "address": f"tcp://127.0.0.1:{4000 + i}",
        "status": "running",
        "nthreads": 1,
        "memory": GIB,
        "memory_limit": 4 * GIB,
        "cpu": 2.0,
        "executing": 0,
        "resources": {},
    }
    row.update(kw)
    return row


def model(workers: list[dict], **kw) -> dict:
    return {"name": "c", "status": "running", "workers": workers, "memory": sum(w["memory"] for w in workers), **kw}


def test_an_idle_cluster_sends_nothing_after_the_full_list():
    feed = WorkerFeed()
    rows = [worker(i) for i in range(256)]
    full = feed.full(model(rows))
    assert len(full["workers"]) == 256
    # heartbeat noise: CPU jitters by a few points, memory by a few MiB (and the total with it)
    noisy = [worker(i, cpu=2.0 + (i % 5), memory=GIB + (i % 7) * 2**20) for i in range(256)]
    assert feed.diff(model(noisy)) is None
    assert feed.diff(model(rows)) is None


def test_changes_removals_and_summary_are_sent_once():
    feed = WorkerFeed()
    feed.full(model([worker(0), worker(1), worker(2)]))
    busy = worker(1, executing=1, cpu=95.0)
    msg = feed.diff(model([worker(0), busy]))
    assert msg == {"changed": [busy], "removed": [worker(2)["address"]]}
    assert feed.diff(model([worker(0), busy])) is None
    # a cluster-level field (not the ever-moving memory total) comes as a summary
    msg = feed.diff(model([worker(0), busy], status="unreachable"))
    assert msg is not None and msg["changed"] == [] and msg["summary"]["status"] == "unreachable"
    assert "workers" not in msg["summary"] and "memory" not in msg["summary"]
    # a new worker is sent whole
    msg = feed.diff(model([worker(0), busy, worker(9)], status="unreachable"))
    assert msg == {"changed": [worker(9)], "removed": []}


def test_a_slow_drift_is_sent_once_it_adds_up():
    """Rows are compared with what was sent, so many small steps are not lost."""
    feed = WorkerFeed()
    feed.full(model([worker(0)]))
    sent = []
    for step in range(1, 40):
        msg = feed.diff(model([worker(0, memory=GIB + step * 8 * 2**20)]))
        if msg:
            sent.append(msg["changed"][0]["memory"])
    # the band is 2 % of 4 GiB (~82 MiB): 39 steps of 8 MiB (312 MiB) send 3 updates, not 39
    assert len(sent) == 3, sent
    assert significant(worker(0), worker(0, status="closing"))
    assert significant(worker(0), worker(0, slurm_job="123"))  # any field a backend adds counts exactly


def test_leases_are_counted_apart_and_idle_while_no_job_runs():
    rows = [worker(0, executing=3), worker(1, executing=1)]
    counts = lease_counts(
        {rows[0]["address"]: [f"{LEASE_PREFIX}a-0", f"{LEASE_PREFIX}a-1", "inc-123"], rows[1]["address"]: ["x"]}
    )
    idle = [dict(r) for r in rows]
    split_leases(idle, counts, jobs_running=0)
    assert [(w["executing"], w["leases"], w["idle_leases"]) for w in idle] == [(1, 2, 2), (1, 0, 0)]
    busy = [dict(r) for r in rows]
    split_leases(busy, counts, jobs_running=1)
    assert [(w["executing"], w["leases"], w["idle_leases"]) for w in busy] == [(3, 2, 0), (1, 0, 0)]


def test_a_finished_maps_lingering_leases_are_found_by_their_key():
    """A real map's leases linger on the workers after it; the scheduler lists them under the prefix."""
    import jupyter_cluster as jc

    handle = jc.start(workers=2, threads=1, processes=False)
    try:
        assert jc.map(abs, range(-20, 0)) == list(range(20, 0, -1))

        def counts_sync():
            return lease_counts(handle.client.processing())

        found = wait_for(lambda: sum(counts_sync().values()), 30, message="lingering leases")
        assert found >= 1
        info = handle.client.scheduler_info(n_workers=-1)["workers"]
        rows = [{"address": a, "executing": 1} for a in info]
        split_leases(rows, counts_sync(), jobs_running=0)
        assert sum(r["idle_leases"] for r in rows) >= 1
        assert all(r["executing"] == max(0, 1 - r["leases"]) for r in rows)
    finally:
        jc.stop(handle.name)
