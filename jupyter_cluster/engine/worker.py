"""What runs on a worker for the direct path: leases and the comm handlers that feed them.

A *lease* is one ordinary Dask task per worker thread a map uses
(:func:`lease`).  It does not secede: the thread stays "executing" in Dask's
accounting, so other work on the cluster never gets a thread a lease holds.
While it runs, the lease takes batches of items from its mailbox and runs
them (:func:`jupyter_cluster.cellfunc.run_chunk`); the client puts batches in
the mailbox and gets results back over Dask's comm, without the scheduler, by
calling the handlers :class:`EnginePlugin` registers on every worker
(``jc_attach``, ``jc_batch``, ``jc_ping``), the way distributed's P2P shuffle
registers its own.

A lease ends when the map sends no more work and Dask cancels it, which Dask
also does when the client that placed it goes away (a kernel killed with
``kill -9``): the lease looks at its task's state between batches and at
least every :data:`IDLE_CHECK_SECONDS`, so no thread stays held.

Only the standard library and distributed are imported here (no notebook
side): this module is loaded into every worker process.
"""

from __future__ import annotations

import asyncio
import hmac
import queue
import threading
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

#: How often an idle lease checks whether its task was cancelled, in seconds.
IDLE_CHECK_SECONDS = 0.05
#: An idle lease gives its thread up after this long when other tasks wait for one on its worker, in seconds.
YIELD_AFTER_SECONDS = 0.1
#: Longest a ``jc_attach`` call waits for its lease to start before answering "waiting", in seconds.
ATTACH_WAIT_SECONDS = 2.0

PLUGIN_NAME = "jupyter-cluster-engine"


class Packed:
    """A value that travels over the comm pickled in one piece.

    Dask's serialisation walks lists, tuples and dicts element by element
    (measured: 240 ms for a batch of 10,000 integers and its results, against
    2 ms in one pickle), so batches and results travel wrapped in this.
    """

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __reduce__(self):
        return (Packed, (self.value,))


class _Lease:
    __slots__ = ("id", "secret", "mailbox", "loop", "closed", "ended")

    def __init__(self, lease_id: str, secret: str, loop):
        self.id = lease_id
        self.secret = secret
        self.mailbox: queue.SimpleQueue = queue.SimpleQueue()
        self.loop = loop
        self.closed = False
        self.ended = False  # the lease function has returned


class _Registry:
    """The leases running in this worker process, and the attach calls waiting for them."""

    def __init__(self):
        self.lock = threading.Lock()
        self.leases: dict[str, _Lease] = {}
        self.waiters: dict[str, list] = {}  # lease id -> asyncio futures of jc_attach calls


_REGISTRY = _Registry()


def _matches(lease: _Lease | None, secret: Any) -> bool:
    return lease is not None and isinstance(secret, str) and hmac.compare_digest(lease.secret, secret)


def _set(fut, value) -> None:
    if not fut.done():
        fut.set_result(value)


async def _attach(comm=None, lease=None, secret=None, wait=ATTACH_WAIT_SECONDS):
    """Answer "ready" once ``lease`` runs here; "waiting" after ``wait`` seconds; "gone" once it ended."""
    reg = _REGISTRY
    with reg.lock:
        found = reg.leases.get(lease)
        if found is None:
            fut = asyncio.get_running_loop().create_future()
            reg.waiters.setdefault(lease, []).append(fut)
    if found is None:
        try:
            found = await asyncio.wait_for(asyncio.shield(fut), timeout=float(wait))
        except asyncio.TimeoutError:
            with reg.lock:
                waiting = reg.waiters.get(lease)
                if waiting and fut in waiting:
                    waiting.remove(fut)
                    if not waiting:
                        reg.waiters.pop(lease, None)
            return {"status": "waiting"}
    if found is False:
        return {"status": "gone"}
    if not _matches(found, secret):
        return {"status": "refused"}
    return {"status": "ready"}


async def _batch(comm=None, lease=None, secret=None, run=None, items=None, budget=None):
    """Queue a batch on ``lease`` and answer with its result (or "gone" if the lease ended first).

    ``run`` is ``(token, blob, star, options)`` of the map (``blob`` None once
    this worker process has the map's function).
    """
    reg = _REGISTRY
    fut = asyncio.get_running_loop().create_future()
    with reg.lock:  # the lease closes under this lock too: no batch is put in a mailbox nobody reads
        found = reg.leases.get(lease)
        if found is None or found.closed:
            return {"status": "gone"}
        if not _matches(found, secret):
            return {"status": "refused"}
        found.mailbox.put((run, items, budget, fut))
    result = await fut
    if result is None:
        return {"status": "gone"}
    if result == "need-fn":
        return {"status": "need-fn"}
    from distributed.protocol import to_serialize

    from ..telemetry.report import current_worker, flush_to_scheduler

    worker = current_worker()
    if worker is not None:  # the batch's reports reach the scheduler before its result reaches the client
        await flush_to_scheduler(worker)
    return {"status": "ok", "result": to_serialize(Packed(result))}


async def _close(comm=None, lease=None, secret=None, wait=0.0):
    """End ``lease`` now (the map is over), instead of when it next sees that Dask cancelled it.

    With ``wait`` > 0, answer once the lease's task has returned (at most
    ``wait`` seconds): a cluster about to close then finds no task to cut off.
    """
    found = _REGISTRY.leases.get(lease)
    if _matches(found, secret):
        found.mailbox.put(None)
        deadline = asyncio.get_running_loop().time() + float(wait)
        # `ended` is set by the lease's own thread; an asyncio.Event may not be set from there
        while not found.ended and asyncio.get_running_loop().time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.005)
    return "OK"


async def _ping(comm=None):
    return "jupyter-cluster-engine"


def install(worker) -> None:
    """Register the engine's comm handlers on ``worker`` (idempotent)."""
    worker.handlers.setdefault("jc_attach", _attach)
    worker.handlers.setdefault("jc_batch", _batch)
    worker.handlers.setdefault("jc_close", _close)
    worker.handlers.setdefault("jc_ping", _ping)


class EnginePlugin(WorkerPlugin):
    """Registers the direct path's comm handlers on every worker, present and future."""

    name = PLUGIN_NAME
    idempotent = True

    def setup(self, worker) -> None:
        install(worker)


def lease(lease_id: str, secret: str, big: dict | None = None) -> int:
    """The lease task: run batches from the mailbox until ended; returns the number of batches run.

    A lease serves one client (``secret``) and may serve several of its maps
    in turn: each batch names its map's function (see :func:`_batch`).
    ``big`` holds the large values of the one map a lease was placed for
    (resolved by Dask, once per lease); such a lease serves only that map.
    """
    from distributed import get_worker

    from .. import cellfunc

    worker = get_worker()
    install(worker)
    key = worker.get_current_task()

    def cancelled() -> bool:
        # Also when the worker is closing: it waits for running tasks, so a lease must not outlive it.
        ts = worker.state.tasks.get(key)
        return (
            ts is None
            or ts.state not in ("executing", "long-running")
            or worker.status.name not in ("running", "paused")
        )

    reg = _REGISTRY
    loop = worker.loop.asyncio_loop  # type: ignore[attr-defined]  # distributed runs an AsyncIOLoop
    me = _Lease(lease_id, secret, loop)
    with reg.lock:
        reg.leases[lease_id] = me
        waiting = reg.waiters.pop(lease_id, [])
    for fut in waiting:
        loop.call_soon_threadsafe(_set, fut, me)
    runs = idle = 0
    try:
        while True:
            try:
                entry = me.mailbox.get(timeout=IDLE_CHECK_SECONDS)
            except queue.Empty:
                if cancelled():
                    return runs
                idle += 1
                if idle * IDLE_CHECK_SECONDS >= YIELD_AFTER_SECONDS and worker.state.ready:
                    # Idle (between maps, or a map's tail) while other tasks wait for a thread here: let them have it.
                    return runs
                continue
            idle = 0
            if entry is None:  # jc_close
                return runs
            run, items, budget, fut = entry
            token, blob, star, options = run.value if isinstance(run, Packed) else run
            if isinstance(items, Packed):
                items = items.value
            if blob is None and token not in cellfunc._STATE.cache and not (big and "__fn__" in big):
                loop.call_soon_threadsafe(_set, fut, "need-fn")  # evicted from the cache: the client resends it
                continue
            opts = options if budget is None else {**options, "budget": budget}
            result = cellfunc.run_chunk(token, blob, big, items, star, opts)
            loop.call_soon_threadsafe(_set, fut, result)
            runs += 1
            if cancelled():
                return runs
    finally:
        with reg.lock:
            me.closed = True
            reg.leases.pop(lease_id, None)
            late = reg.waiters.pop(lease_id, [])
        for fut in late:
            loop.call_soon_threadsafe(_set, fut, False)
        while True:  # batches that arrived after the end: their senders hear "gone" and send them elsewhere
            try:
                entry = me.mailbox.get_nowait()
            except queue.Empty:
                break
            if entry is not None:
                loop.call_soon_threadsafe(_set, entry[-1], None)
        me.ended = True


class Items:
    """A task-path chunk's items and time budget, opaque to Dask.

    ``client.submit`` walks list arguments element by element looking for
    futures to resolve (about 15 µs per item on the client, more than
    everything else the engine does per item).  Items are plain data to the
    engine, so they travel in this wrapper and Dask pickles them in one go.
    """

    __slots__ = ("items", "budget")

    def __init__(self, items: list, budget: float | None = None):
        self.items = items
        self.budget = budget

    def __reduce__(self):
        return (Items, (self.items, self.budget))


def run_items(packed: Items, token: str, blob: bytes | None, big: dict | None, star: bool, options: dict) -> tuple:
    """The task path's task: :func:`run_chunk` on the items of ``packed``."""
    from .. import cellfunc

    if packed.budget is not None:
        options = {**options, "budget": packed.budget}
    return cellfunc.run_chunk(token, blob, big, packed.items, star, options)
