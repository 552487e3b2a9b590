"""The lease task: one ordinary Dask task per worker thread a map uses, running batches from its mailbox.

It does not secede: the thread stays "executing" in Dask's accounting, so
other work on the cluster never gets a thread a lease holds (unless its
items secede, ``worker_client()``: the lease then holds no seat in Dask's
pool, :mod:`.pool_seat`, and ends once idle).  Between maps a
lease is *idle* and waits in its client's pool for the next map
(``engine.linger``); it gives its thread up as soon as a task needs it
(:func:`.registry._make_room`).  A lease of a running map always has its next
batch queued, so it keeps working; one at a map's tail with nothing left to
run yields like an idle one.  Tasks reach a worker whose threads leases hold
because Dask sends the tasks of a large group to a worker up to
``worker-saturation`` times its threads (1.1 by default, rounded up: at least
one more task than threads), and any other task regardless; with
``distributed.scheduler.worker-saturation: 1.0`` the tasks of a large
``client.map`` stay queued on the scheduler, never reach the worker, and
start only when the idle leases end (``engine.linger``).

A lease ends when the map or the pool sends ``jc_close``, when it yields,
and when Dask cancels it, which Dask also does when the client that placed
it goes away (a kernel killed with ``kill -9``): the plugin's hook wakes it
then, and as a backstop it looks at its task's state between batches and at
least every :data:`.registry.IDLE_CHECK_SECONDS`, so no thread stays held.
"""

from __future__ import annotations

import queue
import time

from ..protocol import Batch, MapRun, Status, unpack
from . import registry
from .groups import took_stop
from .handlers import install
from .pool_seat import out_of_pool
from .registry import _REGISTRY, _WAKE, _ask_room, _Lease, _matches, _set
from .run import _STATE, run_chunk

#: A lease whose items seceded ends once it has been idle this long, in seconds (see :func:`lease`).
SECEDED_IDLE_SECONDS = 1.0


def lease(lease_id: str, secret: str, big: dict | None = None) -> int:
    """The lease task: run batches from the mailbox until ended; returns the number of batches run.

    A lease serves one client (``secret``) and may serve several of its maps
    in turn: each batch names its map's function (see :func:`.handlers._batch`).
    ``big`` holds the large values of the one map a lease was placed for
    (resolved by Dask, once per lease); such a lease serves only that map.
    """
    from distributed import get_worker

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
    me = _Lease(lease_id, secret, loop, worker)
    me.last_end = time.monotonic()  # as if a batch had just ended: its map's first one is on the way
    refused = []
    with reg.lock:
        reg.leases[lease_id] = me
        waiting = reg.waiters.pop(lease_id, [])
        for early in reg.early.pop(lease_id, []):
            if _matches(me, early.secret):
                me.mailbox.put(early.batch)
            else:
                refused.append(early.batch.reply)
    for fut in waiting:
        loop.call_soon_threadsafe(_set, fut, me)
    for fut in refused:
        loop.call_soon_threadsafe(_set, fut, Status.REFUSED)
    state = worker.state
    runs = 0
    try:
        # What the plugin's hook saw before this lease was in the registry (cancelled as it started,
        # a task that began waiting meanwhile) it could not tell the lease: look now.
        if cancelled():
            return runs
        if state.ready or state.constrained:
            _ask_room(worker)
        while True:
            try:
                entry = me.mailbox.get(timeout=registry.IDLE_CHECK_SECONDS)
            except queue.Empty:
                if cancelled():
                    return runs
                if out_of_pool() and time.monotonic() - me.last_end >= SECEDED_IDLE_SECONDS:
                    # Its items seceded (worker_client()): Dask counts it long-running, its thread as free,
                    # and it holds no seat in the pool (pool_seat).  Idle, it ends, so that the client's
                    # next map places a lease that holds a thread as leases do.
                    return runs
                if state.ready or state.constrained:  # the plugin's hook was missed: ask again
                    _ask_room(worker)
                continue
            if entry is _WAKE:
                if me.yielding or cancelled():
                    return runs
                continue
            if entry is None:  # jc_close
                return runs
            with reg.lock:
                me.busy = True
                # Told to yield in the instant it took this batch (its mailbox looked empty): it stays,
                # since its map is active, and another idle lease is looked for.
                stays = me.yielding
                if stays:
                    me.yielding = me.closed = False
                    reg.yielded.pop(me.id, None)
            if stays:
                _ask_room(worker)
            try:
                ran = _run_entry(entry, big, loop, lease_id)
            finally:
                me.last_end = time.monotonic()
                me.busy = False
            runs += ran
            if cancelled() or took_stop():  # a terminated pool's lease ends, as its processes would
                return runs
            if (state.ready or state.constrained) and me.mailbox.empty():
                _ask_room(worker)  # idle now (a map's tail, or its end) while tasks wait for a thread here
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
            if entry is not None and entry is not _WAKE:
                loop.call_soon_threadsafe(_set, entry.reply, None)
        me.ended = True


def _run_entry(entry: Batch, big: dict | None, loop, lease_id: str) -> int:
    """Run one batch from a lease's mailbox and answer its ``jc_batch`` call; 1 if it ran, 0 if not.

    The batch runs as work of the stop group named by the lease (:mod:`.groups`): a ``jc_close``
    while it runs (the map was stopped) gives the lease's thread back to Dask at once, even from
    a blocking C call such as ``time.sleep(30)``, so the next map does not queue behind it.
    """
    run = MapRun.of(entry.run)  # a list off the wire
    if run.blob is None and run.token not in _STATE.cache and not (big and "__fn__" in big):
        loop.call_soon_threadsafe(_set, entry.reply, Status.NEED_FN)  # evicted from the cache: the client resends it
        return 0
    try:  # as it came (handlers._batch): unpickled here, in the lease's thread, once the secret was checked
        items = unpack(entry.items)
    except Exception as exc:  # noqa: BLE001 - items this worker cannot unpickle: the batch fails as a whole
        loop.call_soon_threadsafe(_fail, entry.reply, exc)
        return 0
    # Packed here, in the lease's thread: the handler sends it on (and the worker's event loop stays free).
    result = run_chunk(run, items, big, budget=entry.budget, group=lease_id, packed=True)
    loop.call_soon_threadsafe(_set, entry.reply, result)
    return 1


def _fail(fut, exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)


def warm_up() -> bool:
    """Import what a worker's first batch needs and nothing has imported yet (a no-op task at cluster start).

    The telemetry modules (a batch flushes its reports through them) cost a
    new worker about 10 ms on the first map otherwise; they are not preloaded
    in the fork server because their per-process source id is drawn at import.
    """
    import jupyter_cluster.telemetry  # noqa: F401

    return True
