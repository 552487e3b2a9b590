"""A ``jupyter_cluster.Pool`` inside ``with jc.run(...)`` behaves as outside it.

Inside a named run a map's function travels wrapped in a
:class:`~jupyter_cluster.tracking.context.RunCall` (so that the workers' reports are the
run's); what the workers ask of a pool's task besides calling it (the group
``terminate()`` stops, the check that gives ``MaybeEncodingError``) must
still reach the task through it.  Real 2-worker cluster, real pools.
"""

from __future__ import annotations

import os
import time
from multiprocessing.pool import MaybeEncodingError

import pytest

import jupyter_cluster as jc
from jupyter_cluster.engine.direct import pool_for
from jupyter_cluster.pool.worker import _PoolTask
from jupyter_cluster.tracking.context import RunCall

from ..conftest import wait_for


def mark_and_sleep(path, seconds=60):
    open(path, "w").close()
    time.sleep(seconds)  # longer than the test waits: only terminate() gives the thread back in time
    return path


def returns_a_local_function(x=0):
    return lambda: x  # pickle cannot send it back (no name to import it by)


def sq(x):
    return x * x


def test_a_run_call_passes_on_what_the_worker_asks_of_a_pool_task():
    task = _PoolTask(sq, "pool-7", None, (), False)
    call = RunCall(task, "run-1")
    assert call.stop_group == "pool-7"
    assert isinstance(call.check_result(lambda: 0), MaybeEncodingError)
    assert call.check_result(3) is None
    plain = RunCall(sq, "run-1")  # a plain function has neither
    assert plain.stop_group is None and plain.check_result is None


def _busy_keys(client):
    """Tasks the cluster is running, less the leases idle between maps (kept for the next map)."""
    idle = {ls.future.key for leases in pool_for(client).idle.values() for ls in leases}
    return [k for keys in client.processing().values() for k in keys if k not in idle]


def test_terminate_stops_a_long_map_inside_a_run(cluster, tmp_path):
    marks = [str(tmp_path / f"map-{i}") for i in range(10)]
    with jc.run("terminated"):
        p = jc.Pool(2, cluster=cluster)
        try:
            mapped = p.map_async(mark_and_sleep, marks, chunksize=1)
            # The cluster has 2 threads: two marks mean both are in the 60 s sleep.
            wait_for(lambda: sum(map(os.path.exists, marks)) >= 2, timeout=60, message="both threads to be sleeping")
            t0 = time.monotonic()
            p.terminate()
            p.join()
            assert time.monotonic() - t0 < 10
        finally:
            p.terminate()
    # Before the fix the sleeps held both threads for their whole 60 s.
    deadline = time.monotonic() + 20
    while _busy_keys(cluster.client) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _busy_keys(cluster.client), cluster.client.processing()
    with jc.Pool(1, cluster=cluster) as q:  # needs a free thread
        assert q.apply_async(sq, (3,)).get(timeout=20) == 9
    assert sum(map(os.path.exists, marks)) == 2  # the rest of the map never started
    assert not mapped.ready()  # as multiprocessing: unfinished results stay unfinished


@pytest.mark.parametrize(
    "call",
    [
        lambda p: p.map(returns_a_local_function, [1, 2], chunksize=1),
        lambda p: p.map_async(returns_a_local_function, [1]).get(timeout=60),
        lambda p: next(p.imap(returns_a_local_function, [1])),
    ],
    ids=["map", "map_async", "imap"],
)
def test_an_unsendable_result_inside_a_run_is_maybe_encoding_error(cluster, call):
    with jc.run("unsendable"), jc.Pool(2, cluster=cluster) as p:
        with pytest.raises(MaybeEncodingError) as info:
            call(p)
        assert "<lambda>" in info.value.value
        assert p.map(sq, [1, 2, 3]) == [1, 4, 9]  # the pool lives on, as multiprocessing's
