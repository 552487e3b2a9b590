"""The events socket's worker feed: the full list once, then changes only, none while idle.

The diffing is plain data (:class:`WorkerFeed`); the lease count is checked
against a real cluster whose map's leases linger after it.
"""

from __future__ import annotations

import pytest

from jupyter_cluster.server.workers import (
    BUSY_METRIC,
    LEASE_PREFIX,
    WorkerFeed,
    busy_leases,
    lease_counts,
    significant,
    split_leases,
)

from ..conftest import wait_for

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


def test_leases_are_counted_apart_and_idle_unless_their_worker_says_busy():
    rows = [worker(0, executing=3), worker(1, executing=1), worker(2, executing=2)]
    counts = lease_counts(
        {
            rows[0]["address"]: [f"{LEASE_PREFIX}a-0", f"{LEASE_PREFIX}a-1", "inc-123"],
            rows[1]["address"]: ["x"],
            rows[2]["address"]: [f"{LEASE_PREFIX}b-0", f"{LEASE_PREFIX}b-1"],
        }
    )
    # worker 0 reports one working lease, worker 2 none; worker 1 holds no lease
    info = {
        rows[0]["address"]: {"metrics": {BUSY_METRIC: 1}},
        rows[1]["address"]: {"metrics": {}},
        rows[2]["address"]: {"metrics": {BUSY_METRIC: 0}},
    }
    busy = busy_leases(info)
    assert busy == {rows[0]["address"]: 1, rows[2]["address"]: 0}
    for jobs_running in (0, 1):  # a job running elsewhere on the cluster changes nothing
        out = [dict(r) for r in rows]
        split_leases(out, counts, busy, jobs_running=jobs_running)
        assert [(w["executing"], w["leases"], w["idle_leases"]) for w in out] == [(2, 2, 1), (1, 0, 0), (0, 2, 2)]
    # a worker that reports no metric: its leases count as running while a job runs, idle otherwise
    for jobs_running, expect in ((0, (0, 2, 2)), (1, (2, 2, 0))):
        out = [dict(rows[2])]
        split_leases(out, counts, {}, jobs_running=jobs_running)
        assert (out[0]["executing"], out[0]["leases"], out[0]["idle_leases"]) == expect


def test_lingering_leases_are_idle_while_another_map_runs_on_one_worker():
    """A real cluster: after a map its leases linger idle; a second small map makes only its own worker busy.

    The counts come as the server takes them: lease tasks from the scheduler's
    ``processing``, working leases from each worker's heartbeat metric.
    """
    import threading
    import time

    import jupyter_cluster as jc
    from jupyter_cluster.engine.worker.registry import BUSY_METRIC as WORKER_METRIC

    assert WORKER_METRIC == BUSY_METRIC  # the server reads what the workers send
    handle = jc.start(workers=2, threads=1, processes=False)
    client = handle.client

    def rows(jobs_running: int) -> list[dict]:
        info = client.scheduler_info(n_workers=-1)["workers"]
        out = [{"address": a, "executing": len(keys)} for a, keys in client.processing().items()]
        split_leases(out, lease_counts(client.processing()), busy_leases(info), jobs_running)
        return out

    def rows_when(ok) -> list[dict] | None:
        r = rows(1)  # a job runs on the cluster in the server's eyes throughout: it must not matter
        return r if r and all(ok(w) for w in r) else None

    try:
        assert jc.map(abs, range(-20, 0)) == list(range(20, 0, -1))
        # both workers hold a lingering lease, and both say it waits
        idle = wait_for(
            lambda: rows_when(lambda w: w["leases"] >= 1 and w["idle_leases"] == w["leases"]),
            30,
            message="lingering leases reported idle by both workers",
        )
        assert len(idle) == 2 and all(w["executing"] == 0 for w in idle), idle

        done = threading.Event()

        def second() -> None:
            try:
                jc.map(time.sleep, [6.0])
            finally:
                done.set()

        threading.Thread(target=second, daemon=True).start()
        # while the one-item map runs on one worker (a job runs on the cluster), the other's lease is idle
        busy = wait_for(
            lambda: (r := rows(1)) and any(w["idle_leases"] < w["leases"] for w in r) and r,
            30,
            message="a worker reporting its lease busy",
        )
        assert not done.is_set(), "the second map ended before its lease was seen busy"
        working = [w for w in busy if w["idle_leases"] < w["leases"]]
        others = [w for w in busy if w["idle_leases"] == w["leases"]]
        assert len(working) == 1 and working[0]["executing"] >= 1, busy
        assert len(others) == 1 and others[0]["leases"] >= 1 and others[0]["executing"] == 0, busy
        assert done.wait(60)
        # and once it ended, every lease is idle again
        wait_for(lambda: rows_when(lambda w: w["idle_leases"] == w["leases"]), 30, message="all leases idle again")
    finally:
        jc.stop(handle.name)
