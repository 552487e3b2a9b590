"""jupyter_cluster.Queue and jupyter_cluster.actor on a real 2-worker cluster."""

from __future__ import annotations

import os
import queue
import signal
import time

import pytest

import jupyter_cluster as jc
from jupyter_cluster.errors import ClusterError

from ..conftest import wait_for

# -- Queue ---------------------------------------------------------------------------


def test_queue_put_get_fifo_and_types(cluster):
    q = jc.Queue()
    try:
        items = [(1, "a"), {"k": [1, 2]}, b"raw", None, lambda x: x + 1]
        for item in items:
            q.put(item)
        assert q.qsize() == len(items) and not q.empty() and not q.full()
        got = [q.get(timeout=5) for _ in items]
        assert got[:4] == items[:4]
        assert isinstance(got[0], tuple)  # not turned into a list on the way
        assert got[4](1) == 2
        assert q.empty()
    finally:
        q.close()


def test_queue_block_timeout_and_nowait(cluster):
    q = jc.Queue(maxsize=2)
    try:
        q.put(1)
        q.put_nowait(2)
        assert q.full() and q.qsize() == 2
        with pytest.raises(queue.Full):
            q.put_nowait(3)
        t0 = time.monotonic()
        with pytest.raises(queue.Full):
            q.put(3, timeout=0.3)
        assert 0.25 <= time.monotonic() - t0 < 3
        with pytest.raises(queue.Full):
            q.put(3, block=False)
        assert [q.get(), q.get_nowait()] == [1, 2]
        with pytest.raises(queue.Empty):
            q.get_nowait()
        with pytest.raises(queue.Empty):
            q.get(block=False)
        t0 = time.monotonic()
        with pytest.raises(queue.Empty):
            q.get(timeout=0.3)
        assert 0.25 <= time.monotonic() - t0 < 3
        with pytest.raises(ValueError):
            q.get(timeout=-1)
    finally:
        q.close()


def test_queue_between_notebook_and_tasks(cluster):
    client = cluster.client
    requests, replies = jc.Queue(), jc.Queue()

    def server(requests, replies, n):
        # A task that serves requests from the notebook: blocks on the queue.
        for _ in range(n):
            x = requests.get(timeout=20)
            replies.put((x, x * x, os.getpid()))
        return "served"

    fut = client.submit(server, requests, replies, 5, pure=False)
    for x in range(5):
        requests.put(x)
    got = [replies.get(timeout=20) for _ in range(5)]
    assert [g[:2] for g in got] == [(x, x * x) for x in range(5)]
    assert all(g[2] != os.getpid() for g in got)  # really answered by a worker process
    assert fut.result(timeout=20) == "served"

    # Many producers (tasks) into one queue read by the notebook.
    def produce(i, q):
        q.put(i)
        return i

    client.gather(client.map(produce, range(20), [replies] * 20, pure=False))
    assert sorted(replies.get(timeout=5) for _ in range(20)) == list(range(20))
    requests.close()
    replies.close()


def test_queue_blocking_get_wakes_on_put_from_task(cluster):
    q = jc.Queue()

    def late_put(q):
        time.sleep(0.3)
        q.put("late")

    fut = cluster.client.submit(late_put, q, pure=False)
    t0 = time.monotonic()
    assert q.get(timeout=20) == "late"
    assert time.monotonic() - t0 < 10
    fut.result()
    q.close()


def test_queue_by_name_and_closed(cluster):
    a = jc.Queue(maxsize=3, name="shared-q")
    b = jc.Queue(name="shared-q")  # attaches: same queue, its maxsize
    assert b.maxsize == 3
    a.put("x")
    assert b.get(timeout=5) == "x"
    a.close()
    with pytest.raises(ValueError, match="closed"):
        a.put(1)
    with pytest.raises(ClusterError, match="no longer exists"):
        b.put(1)
    with pytest.raises(TypeError):
        jc.Queue(maxsize="big")


def test_queue_timeouts_log_no_errors(cluster, caplog):
    """Polling an empty queue must not fill the scheduler's log with tracebacks."""
    q = jc.Queue()
    with caplog.at_level("WARNING", logger="distributed"):
        for _ in range(3):
            with pytest.raises(queue.Empty):
                q.get(timeout=0.05)
    q.close()
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]


# -- actors ----------------------------------------------------------------------------


class Counter:
    """State that must stay on one worker."""

    def __init__(self, start=0):
        self.n = start
        self.history = []

    def add(self, k=1):
        self.n += k
        self.history.append(k)
        return self.n

    def fail(self):
        raise KeyError("no such thing")

    def where(self):
        return os.getpid()

    def slow(self, seconds):
        time.sleep(seconds)
        return seconds


def test_actor_keeps_state_and_returns_futures(cluster):
    c = jc.actor(Counter, 10)
    try:
        call = c.add(5)
        assert hasattr(call, "result") and call.result(timeout=10) == 15
        assert c.add(k=2).result() == 17
        assert c.n == 17  # instance attribute set in __init__, read remotely
        assert c.history == [5, 2]
        assert c.where().result() != os.getpid()
        assert c.worker in cluster.client.nthreads()
        with pytest.raises(KeyError, match="no such thing"):
            c.fail().result()
        with pytest.raises(TimeoutError):
            c.slow(2).result(timeout=0.1)
        with pytest.raises(AttributeError, match="cannot be set"):
            c.n = 3
    finally:
        c.close()
    with pytest.raises(ValueError, match="closed"):
        c.add(1)


def test_actor_shared_by_tasks(cluster):
    c = jc.actor(Counter)

    def bump(i, counter):
        return counter.add(1).result()

    futures = cluster.client.map(bump, range(10), [c] * 10, pure=False)
    values = cluster.client.gather(futures)
    # Calls run one at a time on one instance: every intermediate value once.
    assert sorted(values) == list(range(1, 11))
    assert c.n == 10
    c.close()


def test_actor_rejects_non_class(cluster):
    with pytest.raises(TypeError, match="needs a class"):
        jc.actor(lambda: 1)


def test_actor_worker_loss_is_a_clear_error(cluster):
    c = jc.actor(Counter)
    assert c.add(1).result(timeout=10) == 1
    pid = c.where().result(timeout=10)
    os.kill(pid, signal.SIGKILL)

    def lost():
        try:
            c.add(1).result(timeout=10)
        except ClusterError as exc:
            return exc
        return None

    exc = wait_for(lost, timeout=30, interval=0.2, message="the actor call to fail")
    assert "was lost" in str(exc) and "Counter" in str(exc)
    c.close()
    # The nanny replaces the worker; the cluster keeps working.
    cluster.wait_for_workers(2, timeout=60)
    assert cluster.client.submit(sum, [1, 2], pure=False).result(timeout=30) == 3
