"""A ``Queue`` wherever multiprocessing code puts it, and a ``Pool`` wider than the cluster.

Real 2-worker, 1-thread-each cluster.  Three cases that failed before
(issue 36): a ``Queue`` used in a ``Pool`` item (the item ran in a helper
thread without distributed's worker context and started a cluster of its
own), a ``Queue`` handed to a standard ``multiprocessing`` child of this
process (its items were silently lost), and ``Pool(5)`` on 2 threads whose
items wait on each other (it deadlocked with no message).
"""

from __future__ import annotations

import multiprocessing
import queue

import pytest

import jupyter_cluster as jc

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("cluster")]  # the module's cluster, current


def put_square(i, q):
    q.put((i, i * i))
    return i


def put_pair(pair):
    q, i = pair
    q.put(i)


def put_from_child(q, text):
    q.put(text)


def ready_then_wait(i, ready, go):
    ready.put(i)
    return go.get(timeout=60) + i


def test_a_queue_works_in_pool_apply_map_and_starmap():
    q = jc.Queue()
    try:
        with jc.Pool() as pool:
            assert pool.apply(put_square, (7, q)) == 7
            pool.starmap(put_square, [(i, q) for i in range(3)])
            got = sorted(q.get(timeout=30) for _ in range(4))
        assert got == [(0, 0), (1, 1), (2, 4), (7, 49)]
    finally:
        q.close()


def test_a_queue_works_in_pool_map():
    q = jc.Queue()
    try:
        with jc.Pool() as pool:
            pool.map(put_pair, [(q, i) for i in range(3)])
        assert sorted(q.get(timeout=30) for _ in range(3)) == [0, 1, 2]
    finally:
        q.close()


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_queue_handed_to_a_standard_multiprocessing_child_delivers(method):
    q = jc.Queue()
    try:
        child = multiprocessing.get_context(method).Process(target=put_from_child, args=(q, f"from {method}"))
        child.start()
        child.join(60)
        assert child.exitcode == 0
        assert q.get(timeout=10) == f"from {method}"  # before: queue.Empty (the item went to another cluster)
    finally:
        q.close()


def test_a_pool_wider_than_the_cluster_runs_all_its_items_at_once():
    # Five items wait until all five have started: on 2 threads they deadlocked before.
    n = 5
    ready, go = jc.Queue(), jc.Queue()
    try:
        with jc.Pool(n) as pool:
            for use_map in (False, True):
                if use_map:
                    result = pool.starmap_async(ready_then_wait, [(i, ready, go) for i in range(n)], chunksize=1)
                else:
                    results = [pool.apply_async(ready_then_wait, (i, ready, go)) for i in range(n)]
                try:
                    started = sorted(ready.get(timeout=30) for _ in range(n))
                except queue.Empty:
                    pytest.fail("Pool(5) on a 2-thread cluster did not start its 5 items at once")
                assert started == list(range(n))
                for _ in range(n):
                    go.put(100)
                if use_map:
                    assert result.get(timeout=30) == [100 + i for i in range(n)]
                else:
                    assert [r.get(timeout=30) for r in results] == [100 + i for i in range(n)]
    finally:
        ready.close()
        go.close()
