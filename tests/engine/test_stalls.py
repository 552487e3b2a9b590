"""No silent stall (issue 37): imap at the pace of the work, the stop button, dropped iterators, paused workers.

Real clusters throughout: the module's 2-worker local cluster (processes,
one thread each) and, for the paused workers, in-process clusters with a
small memory limit.  The timed bounds are several times what the fixed
code takes on a loaded 2-core machine, and far below what the old code took.
"""

from __future__ import annotations

import _thread
import gc
import itertools
import sys
import threading
import time
import warnings

import cloudpickle
import pytest

import jupyter_cluster as jc
from jupyter_cluster import mapping
from jupyter_cluster.engine import paused as engine_paused
from jupyter_cluster.engine import threads_watch
from jupyter_cluster.engine.planner import PROBE_ITEMS
from jupyter_cluster.errors import ClusterError

from ..conftest import wait_for

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def slow_item(x):
    """A fifth of a second of work (the issue's imap case)."""
    time.sleep(0.2)
    return x


def test_imap_results_come_at_the_pace_of_the_work(cluster):
    """Old: 2nd result 0.8 s, then the 12th at 24-50 s with 233-514 items run, the probes' leftovers
    re-queued newest first behind the read-ahead; ``itertools.count()`` read 1,024-2,048 items."""
    t0 = time.monotonic()
    it = mapping.imap(slow_item, range(1000), client=cluster, progress=False)
    try:
        for k, value in enumerate(it):
            assert value == k
            if k == 11:
                break
        twelfth = time.monotonic() - t0
        ran = it.done
    finally:
        it.cancel()
    # Fixed: ~2 s and ~17 items (2 workers × 0.2 s items).
    assert twelfth < 10, f"the 12th result took {twelfth:.1f} s"
    assert ran < 60, f"{ran} items ran for 12 results"

    endless = mapping.imap(slow_item, itertools.count(), client=cluster, progress=False)
    try:
        assert [next(endless), next(endless)] == [0, 1]
        assert endless.items_read <= PROBE_ITEMS + 16, f"read {endless.items_read} items for 2 results"
    finally:
        endless.cancel()


def test_a_map_after_the_stop_button_on_long_c_calls_starts_at_once(cluster):
    """Old: the next 4-item map waited ~27 s (the interrupted leases' threads stayed in time.sleep(30))."""
    mapping.map(abs, [1, 2], client=cluster, progress=False)  # leases of this client in place
    timer = threading.Timer(2.0, _thread.interrupt_main)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            mapping.map(time.sleep, [30] * 2, client=cluster, progress=False)
    finally:
        timer.cancel()
    t0 = time.monotonic()
    assert mapping.map(abs, [-1, -2, -3, -4], client=cluster, progress=False) == [1, 2, 3, 4]
    assert time.monotonic() - t0 < 8, "the next map queued behind the stopped map's C calls"


def test_dropping_an_unfinished_imap_is_quiet(capfd):
    """Old: "coroutine '_close' was never awaited" (the job collected after its cluster closed) and
    Dask's "Async instruction ... ended with CancelledError" (its leases cut off by the close)."""
    handle = jc.start(workers=1, threads=1)
    try:
        it = mapping.imap(time.sleep, [0.3] * 20, client=handle, progress=False)
        next(it)
    finally:
        handle.close()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del it
        gc.collect()
    assert not [w for w in caught if "never awaited" in str(w.message)], [str(w.message) for w in caught]
    err = capfd.readouterr().err
    assert "never awaited" not in err and "ended with CancelledError" not in err, err[-2000:]


class _Stamped:
    """A stderr that notes when a text first appeared on it."""

    def __init__(self, real, text: str):
        self.real, self.text, self.at = real, text, None

    def write(self, s: str) -> int:
        if self.at is None and self.text in s:
            self.at = time.monotonic()
        return self.real.write(s)

    def flush(self) -> None:
        self.real.flush()


def _all_paused(handle) -> bool:
    workers = handle.client.scheduler_info(n_workers=-1)["workers"]
    return bool(workers) and all(w.get("status") == "paused" for w in workers.values())


def _pause_by_process_memory(dask_worker) -> None:
    dask_worker.memory_manager.memory_pause_fraction = 0.8  # Dask's default, which in-process workers now skip


def test_a_map_on_paused_workers_says_so_within_seconds_then_stops(monkeypatch):
    """Old: no word, and the map waited for ever (300 s until pytest's timeout in a CI run).

    In-process workers with a limit far below the kernel's memory, told after they
    started to count the process's memory as Dask does (``local.in-process-memory-pause``
    at the start would pause them before they register): all pause.
    """
    monkeypatch.setattr(engine_paused, "GIVE_UP_SECONDS", 4.0)
    handle = jc.start(workers=2, threads=1, memory_limit="48MiB", processes=False)
    try:
        handle.client.run(_pause_by_process_memory)
        wait_for(lambda: _all_paused(handle), timeout=20, message="the workers to pause")
        stamped = _Stamped(sys.stderr, "is paused by Dask")
        monkeypatch.setattr(sys, "stderr", stamped)
        job = mapping.MapJob(abs, ([-1, -2],), client=handle, progress=False)
        t0 = time.monotonic()
        deadline = t0 + 40
        with pytest.raises(ClusterError) as info:
            while not job.finished and time.monotonic() < deadline:
                job._step()
        assert stamped.at is not None and stamped.at - t0 < 10, "no word of the paused workers within 10 s"
        text = str(info.value)
        assert "paused" in text and "48.00 MiB" in text and "--memory-limit" in text, text
        assert time.monotonic() - t0 < 30
    finally:
        handle.close()


def test_in_process_workers_do_not_hold_the_kernels_memory_against_their_limit():
    """Old: with processes=False each worker measured the whole kernel's memory and paused."""
    handle = jc.start(workers=2, threads=1, memory_limit="48MiB", processes=False)
    try:
        time.sleep(1.0)  # Dask's memory monitor looks every 0.1 s
        workers = handle.client.scheduler_info(n_workers=-1)["workers"]
        assert {w["status"] for w in workers.values()} == {"running"}
        assert mapping.map(abs, [-1, -2], client=handle, progress=False) == [1, 2]
    finally:
        handle.close()


def where_am_i(x):
    from distributed import get_worker

    return get_worker().address


def nested(x):
    from distributed import worker_client

    with worker_client() as client:  # secede(), then rejoin(): on the helper thread, in the task's seat
        return client.submit(abs, -x, pure=False).result()


def test_items_still_find_their_worker_and_secede_from_the_batchs_helper_thread(cluster):
    """Batches run in a helper thread of the lease's (so the stop button frees it): distributed's
    get_worker() lives in a context variable the helper must run in, and worker_client()'s
    secede()/rejoin() act on the calling thread's seat in Dask's pool (1-thread workers: no deadlock)."""
    addresses = set(cluster.client.scheduler_info(n_workers=-1)["workers"])
    assert set(mapping.map(where_am_i, range(4), client=cluster, progress=False)) <= addresses
    assert set(mapping.map(where_am_i, range(2), timeout=30, client=cluster, progress=False)) <= addresses
    assert mapping.map(nested, range(4), client=cluster, progress=False) == [0, 1, 2, 3]
    assert mapping.map(abs, [-1, -2], client=cluster, progress=False) == [1, 2]  # the pool is whole again


def seceded_pair(k):
    """Item 0 waits for a nested task (secede, rejoin) and is done; item 1 then waits for a task on item 0's worker."""
    from distributed import Variable, get_worker, worker_client

    here = get_worker().address
    with worker_client() as client:
        first = Variable("jc-test-stalls-first-worker", client=client)
        if k == 0:
            assert client.submit(abs, -1, pure=False).result(timeout=30) == 1
            first.set(here)
            return here
        there = first.get(timeout=30)
        time.sleep(0.5)  # item 0 rejoined and returned: its lease is idle in this map, its batch answered
        assert client.submit(abs, -2, pure=False, workers=[there], allow_other_workers=False).result(timeout=30) == 2
        return here


def test_a_task_on_the_worker_of_an_item_that_seceded_and_returned_runs(cluster):
    """The CI hang (~1 run in 10 alone): Dask counts a lease whose item seceded as long-running for good,
    so it started a nested task of another item "on its free thread", which the rejoined lease held.

    Old: the task waited in the worker's pool queue behind the idle lease, the item for it, the map
    for the item: for ever (here 30 s, then the item's TimeoutError).
    """
    t0 = time.monotonic()
    where = mapping.map(seceded_pair, [0, 1], client=cluster, progress=False)
    assert time.monotonic() - t0 < 25
    assert len(where) == 2
    assert mapping.map(abs, [-1, -2], client=cluster, progress=False) == [1, 2]


def test_work_after_a_map_whose_items_seceded_is_not_queued_behind_its_lease():
    """Old: the map's lease, idle in the client's pool (engine.linger, 60 s), held the 1-thread worker's
    only seat while Dask counted its task long-running: a task submitted next waited 60 s for it."""
    handle = jc.start(workers=1, threads=1)
    try:
        assert mapping.map(nested, [1, 2], client=handle, progress=False) == [1, 2]
        t0 = time.monotonic()
        assert handle.client.submit(abs, -3, pure=False).result(timeout=30) == 3
        assert time.monotonic() - t0 < 15
        assert mapping.map(abs, [-1, -2], client=handle, progress=False) == [1, 2]
    finally:
        handle.close()


def waits_for_its_task_on_its_thread(x):
    from distributed import get_client

    return get_client().submit(abs, -x, pure=False).result()  # no worker_client(): its thread stays taken


def test_a_map_whose_items_wait_for_tasks_that_wait_for_their_threads_says_so(monkeypatch):
    """Old: no word, the map waited for ever (1 thread, held by the item that waits for its task)."""
    monkeypatch.setattr(threads_watch, "NOTICE_SECONDS", 2.0)
    monkeypatch.setattr(threads_watch, "LOOK_EVERY_SECONDS", 0.5)
    handle = jc.start(workers=1, threads=1)
    try:
        stamped = _Stamped(sys.stderr, "wait for a thread")
        monkeypatch.setattr(sys, "stderr", stamped)
        job = mapping.MapJob(waits_for_its_task_on_its_thread, ([1],), client=handle, progress=False)
        t0 = time.monotonic()
        while stamped.at is None and not job.finished and time.monotonic() < t0 + 40:
            job._step()
        assert stamped.at is not None and stamped.at - t0 < 25, "no word of the task waiting for a thread"
        assert not job.finished
        job.cancel()
    finally:
        handle.close()
