"""A stop group's call that secedes and rejoins leaves its seat in Dask's thread pool for good (pool_seat).

Dask's own ThreadPoolExecutor, one thread, as a 1-thread worker has it; the
"lease" is a task of that pool that runs a call in its stop group's helper
thread (:func:`.groups.run_in_group`), as every lease batch does, and then
stays, as an idle lease does.  Dask counts a task that seceded as
long-running for good (``rejoin()`` does not tell the worker), so it starts
other work on the thread it believes free: that work must run.
"""

from __future__ import annotations

import itertools
import threading
import time

import pytest
from distributed.threadpoolexecutor import ThreadPoolExecutor, rejoin, secede

from jupyter_cluster.engine.worker.groups import run_in_group

_names = itertools.count()


def _nested_like() -> str:
    """What ``worker_client()`` does around waiting for the tasks it submitted."""
    try:
        secede()
    except KeyError:  # already out of the pool (worker_client skips its rejoin then)
        return "out already"
    rejoin()
    return "rejoined"


@pytest.fixture
def pool():
    executor = ThreadPoolExecutor(max_workers=1)
    yield executor
    executor.shutdown(wait=False)


def _lease(calls: int, ran: list, idle: threading.Event, release: threading.Event) -> str:
    group = f"unit-pool-seat-{next(_names)}"
    for _ in range(calls):
        ran.append(run_in_group(group, _nested_like))
    idle.set()
    release.wait(60)
    return "lease ended"


@pytest.mark.parametrize("calls", [1, 2])
def test_work_dask_starts_after_a_call_seceded_runs_while_the_lease_stays(pool, calls):
    """Old: the lease took its seat back after the call's rejoin(); the next task waited in the pool's
    queue until the lease ended (a map whose item waited for it: for ever)."""
    ran: list = []
    idle, release = threading.Event(), threading.Event()
    lease = pool.submit(_lease, calls, ran, idle, release)
    try:
        assert idle.wait(10), "the lease's calls did not return"
        assert ran == ["rejoined"] + ["out already"] * (calls - 1)
        other = pool.submit(lambda: "other")  # what Dask starts on the thread it counts as free
        assert other.result(timeout=10) == "other"
    finally:
        release.set()
    assert lease.result(timeout=10) == "lease ended"
    # The pool is whole: the lease's thread ended with its task (a seceded thread does), one seat remains.
    assert [pool.submit(abs, -k).result(timeout=10) for k in range(3)] == [0, 1, 2]
    assert len(pool._threads) == 1


def test_a_call_that_does_not_secede_gives_the_seat_back(pool):
    """The usual batch: the lease keeps its thread, and other work queues behind it until it ends."""
    idle, release = threading.Event(), threading.Event()

    def lease() -> str:
        assert run_in_group(f"unit-pool-seat-{next(_names)}", abs, -2) == 2
        idle.set()
        release.wait(60)
        return "lease ended"

    held = pool.submit(lease)
    try:
        assert idle.wait(10)
        other = pool.submit(lambda: "other")
        time.sleep(0.3)
        assert not other.done()
    finally:
        release.set()
    assert held.result(timeout=10) == "lease ended"
    assert other.result(timeout=10) == "other"
    assert len(pool._threads) == 1


def test_the_threads_watch_counts_tasks_waiting_for_a_thread():
    from jupyter_cluster.engine.threads_watch import ThreadsWatch, waiting_for_threads
    from jupyter_cluster.engine.worker.registry import UNSTARTED_METRIC

    workers = {
        "a": {"metrics": {"task_counts": {"ready": 1, "executing": 1}, UNSTARTED_METRIC: 0}},
        "b": {"metrics": {"task_counts": {"executing": 2}, UNSTARTED_METRIC: 1}},
        "c": {"metrics": {"task_counts": {"long-running": 1}}},
        "d": {},
    }
    assert waiting_for_threads(workers) == {"a": 1, "b": 1}
    watch = ThreadsWatch(lambda: workers)
    watch.check(3, True, now=0.0)
    watch.check(3, True, now=30.0)
    assert not watch.told  # long items look the same for a while
    watch.check(3, False, now=100.0)
    assert not watch.told  # nothing in flight: not this watch's case
    watch.check(3, True, now=100.0)
    assert watch.told
