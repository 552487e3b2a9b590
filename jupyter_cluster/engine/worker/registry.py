"""The leases running in one worker process, and how idle ones give their threads up.

Shared by the comm handlers (:mod:`.handlers`) and the lease task
(:mod:`.lease`).  An idle lease (no batch running or queued) gives its thread
up as soon as a task needs it: :class:`.handlers.EnginePlugin`'s
``transition`` hook sees every task that starts waiting on the worker
(``ready``, or ``constrained`` by a resource an idle lease holds) and
:func:`_make_room` has one idle lease per task that lacks a thread return at
once, so Dask starts that task on the freed thread within milliseconds.
"""

from __future__ import annotations

import hmac
import queue
import threading
import time
from typing import Any, NamedTuple

from ..protocol import Batch

#: How often an idle lease looks, by itself, whether its task was cancelled or a task waits for its thread,
#: in seconds.  A backstop only: :class:`.handlers.EnginePlugin` wakes it at once when either happens.
IDLE_CHECK_SECONDS = 0.25
#: How long after its batch ended a lease still counts as working, not idle, when a task waits for its
#: thread (seconds): the client's next batch of an active map may be on its way.
YIELD_GRACE_SECONDS = 0.2
#: Longest a ``jc_attach`` call waits for its lease to start before answering "waiting", in seconds.
ATTACH_WAIT_SECONDS = 2.0
#: Longest a map's first batch to a lease that has not started yet waits for it on the worker before
#: answering "waiting" (the client then sends it to a lease that runs), in seconds.
EARLY_WAIT_SECONDS = 0.5

#: The custom worker metric (``Worker.metrics``, sent with heartbeats, ``WorkerState.metrics`` on the scheduler)
#: that says how many of a worker's leases are working: the server shows the others as idle.
BUSY_METRIC = "jc_busy_leases"

#: The custom worker metric that says how many tasks Dask started there wait in its thread pool's queue.
UNSTARTED_METRIC = "jc_unstarted_tasks"

#: Put in a lease's mailbox to make it look at once whether it should end (yield its thread, or cancelled).
_WAKE = "wake"


class _Lease:
    __slots__ = ("id", "secret", "mailbox", "loop", "worker", "closed", "ended", "busy", "yielding", "last_end")

    def __init__(self, lease_id: str, secret: str, loop, worker=None):
        self.id = lease_id
        self.secret = secret
        self.mailbox: queue.SimpleQueue = queue.SimpleQueue()
        self.loop = loop
        self.worker = worker  # the Worker whose thread it holds (a process may host several)
        self.closed = False  # takes no more batches ("gone"); set under the registry's lock
        self.ended = False  # the lease function has returned
        self.busy = False  # running a batch
        self.yielding = False  # told to give its thread to a waiting task (:func:`_make_room`)
        self.last_end = 0.0  # time.monotonic() when its last batch ended


class Early(NamedTuple):
    """A batch sent to a lease that has not started here yet, kept for it (``jc_batch`` with ``wait``)."""

    batch: Batch
    secret: str


class _Registry:
    """The leases running in this worker process, and the attach calls waiting for them."""

    def __init__(self):
        self.lock = threading.Lock()
        self.leases: dict[str, _Lease] = {}
        self.waiters: dict[str, list] = {}  # lease id -> asyncio futures of jc_attach calls
        # Keys of leases told to yield whose task the worker still counts as executing (their
        # thread is about to be free: a waiting task is not given a second one).
        self.yielded: dict[str, _Lease] = {}
        self.room_asked: set[int] = set()  # id() of workers with a _make_room call scheduled
        # Lease id -> batches sent before the lease started (:func:`.handlers._batch` with ``wait``): the lease
        # moves them into its mailbox as it registers, so its first batch needs no other message.
        self.early: dict[str, list[Early]] = {}


_REGISTRY = _Registry()


def busy_leases(worker) -> int:
    """How many of ``worker``'s leases run a batch, have one queued or ended one within the grace (a metric).

    The grace is :data:`YIELD_GRACE_SECONDS`, as in :func:`_make_room`: a lease
    between two batches of an active map is working, not idle.
    """
    recent = time.monotonic() - YIELD_GRACE_SECONDS
    with _REGISTRY.lock:
        return sum(
            1 for ls in _REGISTRY.leases.values() if ls.worker is worker and not ls.closed and _working(ls, recent)
        )


def _working(ls: _Lease, recent: float | None = None) -> bool:
    """Whether a lease is working, not idle: a batch running or queued; with ``recent``, also one that ended since.

    ``recent`` is a ``time.monotonic()``, :data:`YIELD_GRACE_SECONDS` ago: a
    lease of an active map is between two batches then, its next one on its way.
    """
    return ls.busy or not ls.mailbox.empty() or (recent is not None and ls.last_end > recent)


def unstarted_tasks(worker) -> int:
    """Tasks of ``worker`` that Dask started and its thread pool has not: they wait for a thread (a metric).

    Nothing waits there while Dask's count of free threads is right; a map
    that stalls with some says so (:class:`..threads_watch.ThreadsWatch`).
    """
    queued = getattr(worker.executors.get("default"), "_work_queue", None)
    return queued.qsize() if queued is not None else 0


def report_busy(worker) -> None:
    """Have ``worker``'s heartbeats carry :func:`busy_leases` as :data:`BUSY_METRIC` (once per worker),
    and :func:`unstarted_tasks` as :data:`UNSTARTED_METRIC`."""
    worker.metrics.setdefault(BUSY_METRIC, busy_leases)
    worker.metrics.setdefault(UNSTARTED_METRIC, unstarted_tasks)


def _matches(lease: _Lease | None, secret: Any) -> bool:
    return lease is not None and isinstance(secret, str) and hmac.compare_digest(lease.secret, secret)


def _set(fut, value) -> None:
    if not fut.done():
        fut.set_result(value)


def _queued(lease: str) -> bool:
    """Whether a worker of this process holds ``lease``'s task without running it (queued behind other work).

    False while no worker has the task yet (Dask is still sending it): the
    batch waits for it then.  Every worker of the process is looked at (a
    process may host several; the handler is not bound to one).
    """
    from distributed import Worker

    for w in list(Worker._instances):
        ts = w.state.tasks.get(lease)
        if ts is not None:
            return ts.state not in ("executing", "long-running")
    return False


def _ask_room(worker) -> None:
    """Have :func:`_make_room` run on ``worker``'s event loop soon (once, however often asked meanwhile).

    Thread-safe: called from the loop (the plugin's hook) and from lease threads.
    """
    asked = _REGISTRY.room_asked
    if id(worker) in asked:
        return
    asked.add(id(worker))
    worker.loop.add_callback(_make_room, worker)


def _restrictions(state, lease: _Lease) -> dict:
    ts = state.tasks.get(lease.id)
    return (ts.resource_restrictions or {}) if ts is not None else {}


def _make_room(worker) -> None:
    """Give waiting tasks the threads of ``worker``'s idle leases: one lease per task that lacks a thread.

    Runs on the worker's event loop, after the worker has started every task
    it had a thread for, so what still waits in ``state.ready`` (or in
    ``state.constrained``, for resources an idle lease holds) needs a thread
    a lease holds.  Idle means no batch running or queued, and none ended in
    the last ``YIELD_GRACE_SECONDS``: a lease of an active map has its next
    batch queued or on its way, so it keeps working.  A
    lease told to yield takes no more batches (their senders hear "gone"),
    returns, and Dask gives its thread to the waiting task.
    """
    reg = _REGISTRY
    reg.room_asked.discard(id(worker))
    state = worker.state
    if not state.running or not (state.ready or state.constrained):
        return
    executing = {ts.key for ts in state.executing}
    recent = time.monotonic() - YIELD_GRACE_SECONDS
    with reg.lock:
        for key, ls in list(reg.yielded.items()):
            if ls.worker is worker and key not in executing:
                del reg.yielded[key]  # its thread is free again (and taken, or it would not be waiting)
        pending = [ls for ls in reg.yielded.values() if ls.worker is worker]
        free = [ls for ls in reg.leases.values() if ls.worker is worker and not ls.closed and not _working(ls)]
        idle = [ls for ls in free if not _working(ls, recent)]
        if len(idle) < len(free):
            # A lease whose batch has just ended is between two batches of an active map while its
            # client's next batch is on the way (the first round sends one per lease): it is looked
            # at again once that round trip has had its time.
            worker.loop.call_later(YIELD_GRACE_SECONDS, _ask_room, worker)
        if not idle:
            return
        held = {ls.id: _restrictions(state, ls) for ls in idle}
        idle.sort(key=lambda ls: bool(held[ls.id]))  # leases holding no resources go first
        avail = dict(state.available_resources)
        for ls in pending:
            for name, amount in _restrictions(state, ls).items():
                avail[name] = avail.get(name, 0) + amount
        supply = max(state.nthreads - len(executing), 0) + len(pending)
        demand = len(state.ready)
        chosen: list[_Lease] = []
        for ts in sorted(state.constrained, key=lambda t: t.priority):
            need = ts.resource_restrictions or {}
            short = {name for name, amount in need.items() if avail.get(name, 0) < amount}
            picks: list[_Lease] = []
            for ls in idle:
                if not short:
                    break
                if short & held[ls.id].keys():
                    picks.append(ls)
                    for name, amount in held[ls.id].items():
                        avail[name] = avail.get(name, 0) + amount
                    short = {name for name, amount in need.items() if avail.get(name, 0) < amount}
            if short:  # no idle lease holds what it waits for: yielding would not start it
                for ls in picks:
                    for name, amount in held[ls.id].items():
                        avail[name] -= amount
                continue
            for name, amount in need.items():
                avail[name] = avail.get(name, 0) - amount
            for ls in picks:
                idle.remove(ls)
            chosen += picks
            supply += len(picks)
            demand += 1
        chosen += idle[: max(demand - supply, 0)]
        for ls in chosen:
            ls.closed = ls.yielding = True
            reg.yielded[ls.id] = ls
            ls.mailbox.put(_WAKE)
