"""What runs on a worker for the direct path: leases and the comm handlers that feed them.

A *lease* is one ordinary Dask task per worker thread a map uses
(:func:`lease`).  It does not secede: the thread stays "executing" in Dask's
accounting, so other work on the cluster never gets a thread a lease holds.
While it runs, the lease takes batches of items from its mailbox and runs
them (:func:`run_chunk`); the client puts batches in
the mailbox and gets results back over Dask's comm, without the scheduler, by
calling the handlers :class:`EnginePlugin` registers on every worker
(``jc_attach``, ``jc_batch``, ``jc_ping``), the way distributed's P2P shuffle
registers its own.

Between maps a lease is *idle* (no batch running or queued) and waits in
its client's pool for the next map (``engine.linger``).  It gives its thread
up as soon as a task needs it: the plugin's ``transition`` hook sees every
task that starts waiting on the worker (``ready``, or ``constrained`` by a
resource an idle lease holds) and :func:`_make_room` has one idle lease per
task that lacks a thread return at once, so Dask starts that task on the
freed thread within milliseconds.  A lease of a running map always has its
next batch queued, so it keeps working; one at a map's tail with nothing
left to run yields like an idle one.  Tasks reach a worker whose threads
leases hold because Dask sends the tasks of a large group to a worker up to
``worker-saturation`` times its threads (1.1 by default, rounded up: at
least one more task than threads), and any other task regardless; with
``distributed.scheduler.worker-saturation: 1.0`` the tasks of a large
``client.map`` stay queued on the scheduler, never reach the worker, and
start only when the idle leases end (``engine.linger``).

A lease ends when the map or the pool sends ``jc_close``, when it yields,
and when Dask cancels it, which Dask also does when the client that placed
it goes away (a kernel killed with ``kill -9``): the plugin's hook wakes it
then, and as a backstop it looks at its task's state between batches and at
least every :data:`IDLE_CHECK_SECONDS`, so no thread stays held.

It also holds the worker half of every map (:func:`run_chunk`, moved here
from ``cellfunc``): it loads the function once per worker process (cached by
token, so a notebook-defined class is rebuilt once, not per item), runs each
item in a fresh namespace (a cell's targets bound, its last expression kept),
captures ``print`` output per item and per thread (bounded), times each item,
applies ``--retries`` (stopping when cancelled) and ``--timeout``, and
returns failures as data (exception, traceback text, frames) instead of
failing the whole batch.  A ``Pool``'s items run in a helper thread of their
task's thread (:func:`run_in_group`), so that ``Pool.terminate()`` gives the
task's thread back to Dask at once (:func:`stop_group`), even from a blocking
C call.

Only the standard library, cloudpickle, distributed and the cell function
are imported here (no notebook side): this module is loaded into every worker
process.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import io
import pickle
import queue
import sys
import threading
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import cloudpickle
import msgpack
from distributed.diagnostics.plugin import WorkerPlugin

from ..cellfunc import ITEM_NAME, RESULT_NAME, CellFunction

#: How often an idle lease looks, by itself, whether its task was cancelled or a task waits for its thread,
#: in seconds.  A backstop only: :class:`EnginePlugin` wakes it at once when either happens.
IDLE_CHECK_SECONDS = 0.25
#: How long after its batch ended a lease still counts as working, not idle, when a task waits for its
#: thread (seconds): the client's next batch of an active map may be on its way.
YIELD_GRACE_SECONDS = 0.2
#: Longest a ``jc_attach`` call waits for its lease to start before answering "waiting", in seconds.
ATTACH_WAIT_SECONDS = 2.0
#: Longest a map's first batch to a lease that has not started yet waits for it on the worker before
#: answering "waiting" (the client then sends it to a lease that runs), in seconds.
EARLY_WAIT_SECONDS = 0.5

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


#: A batch's items or result pickled to at most this many bytes travels inside the message as bytes.
INLINE_BYTES = 4 * 1024 * 1024


def pack(value: Any) -> Any:
    """``value`` ready for the comm: its pickle as ``bytes``, or Dask frames when large.

    Bytes travel inside Dask's msgpack message, past Dask's serialisation
    machinery (a dispatch, a header, a compression check, a size estimate:
    about a fifth of a worker's CPU per batch when hundreds of small batches
    pass, profiled in benchmarks/scale_sim.py), and a relay forwards them
    without unpickling.  Values holding out-of-band buffers (arrays) or
    pickling to more than :data:`INLINE_BYTES` travel as frames
    (:class:`Packed`), which Dask sends without copying.  Pickled like Dask
    pickles (cloudpickle for what plain pickle cannot take).
    """
    from distributed.protocol import to_serialize

    buffers: list = []
    try:
        # Plain pickle first: Dask's own dumps also asks inspect.getmodule() of the value, which for a
        # list raises and catches an exception inside (4 µs of a 0.4 µs pickle; 256 batches a round).
        blob = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    except Exception:  # noqa: BLE001 - what plain pickle cannot take, Dask's dumps (cloudpickle) may
        blob = None
    if blob is None or b"__main__" in blob or cloudpickle.list_registry_pickle_by_value():
        from distributed.protocol import pickle as dask_pickle

        buffers.clear()
        blob = dask_pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    if not buffers and len(blob) <= INLINE_BYTES:
        return blob
    return to_serialize(Packed(value))


def unpack(data: Any) -> Any:
    """The value of what :func:`pack` made, once received (or still local: a ``Serialize``)."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        from distributed.protocol import pickle as dask_pickle

        return dask_pickle.loads(data)
    data = getattr(data, "data", data)  # a local Serialize
    return data.value if isinstance(data, Packed) else data


def _forwardable(data: Any) -> Any:
    """What :func:`pack` made, received by a relay, ready to send on without unpickling it."""
    if data is None or isinstance(data, (bytes, list, tuple)):
        return data
    from distributed.protocol import to_serialize

    return to_serialize(Packed(unpack(data)))


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
        # Lease id -> batches sent before the lease started (:func:`_batch` with ``wait``): the lease
        # moves them into its mailbox as it registers, so its first batch needs no other message.
        self.early: dict[str, list] = {}


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


async def _batch(comm=None, lease=None, secret=None, run=None, items=None, budget=None, wait=None):
    """Queue a batch on ``lease`` and answer with its result (or "gone" if the lease ended first).

    ``run`` is ``(token, blob, star, options)`` of the map (``blob`` None once
    this worker process has the map's function); ``items`` and the answer's
    ``result`` travel as :func:`pack` made them.  With ``wait`` (seconds), a
    lease that has not started here yet is waited for: the batch is kept
    for it and it takes the batch the moment it starts, so a map's first
    batch travels while Dask is still starting the lease (one message less
    than attaching first).  "waiting" (the client sends the batch elsewhere)
    at once if the worker holds the lease's task queued behind other work,
    as soon as it queues it (:class:`EnginePlugin`), and after ``wait``
    seconds in any case.
    """
    reg = _REGISTRY
    fut = asyncio.get_running_loop().create_future()
    early = None
    with reg.lock:  # the lease closes under this lock too: no batch is put in a mailbox nobody reads
        found = reg.leases.get(lease)
        if found is None and wait:
            early = (run, unpack(items), budget, fut, secret)
            reg.early.setdefault(lease, []).append(early)
        elif found is None or found.closed:
            return {"status": "gone"}
        elif not _matches(found, secret):
            return {"status": "refused"}
        else:
            found.mailbox.put((run, unpack(items), budget, fut))
    if early is not None:
        if _queued(lease) and _drop_early(lease, early):
            return {"status": "waiting"}
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout=float(wait))
        except asyncio.TimeoutError:
            if _drop_early(lease, early):  # the lease never came for it: the client sends it elsewhere
                return {"status": "waiting"}
        except asyncio.CancelledError:  # the caller's connection closed: nobody waits for it any more
            _drop_early(lease, early)
            raise
    result = await fut
    if result is None:
        return {"status": "gone"}
    if result == "need-fn":
        return {"status": "need-fn"}
    if result == "refused":
        return {"status": "refused"}
    if result == "waiting":  # bounced by _bounce_early: its lease's task is queued here
        return {"status": "waiting"}
    from ..telemetry.report import _producer, current_worker, flush_to_scheduler

    # The batch's reports reach the scheduler before its result reaches the client.  Looked up only
    # when there are some: finding the worker walks the process's workers (64 in benchmarks/scale_sim.py).
    if _producer.pending:
        worker = current_worker()
        if worker is not None:
            await flush_to_scheduler(worker)
    return {"status": "ok", "result": pack(result)}


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


def _bounce_early(lease: str) -> None:
    """Answer "waiting" to the batches kept for ``lease`` if its task is queued (on the worker's loop)."""
    if not _queued(lease):
        return
    with _REGISTRY.lock:
        kept = _REGISTRY.early.pop(lease, [])
    for entry in kept:
        _set(entry[3], "waiting")


def _drop_early(lease: str, early: tuple) -> bool:
    """Take back a batch kept for a lease that has not started; False if the lease took it meanwhile."""
    reg = _REGISTRY
    with reg.lock:
        kept = reg.early.get(lease, [])
        if not any(e is early for e in kept):
            return False
        kept[:] = [e for e in kept if e is not early]  # by identity: items need not compare
        if not kept:
            del reg.early[lease]
        return True


#: Longest wait for a relay's connection to a member worker, in seconds (as the client's own, engine.dask).
RELAY_CONNECT_TIMEOUT_SECONDS = 10.0


async def _relay(worker, comm=None, entries=None):
    """Forward a group's batches to their leases and answer with all their answers, in order.

    ``entries`` (a list, or one :class:`Packed` list) holds ``(address, lease,
    secret, run, items, budget)`` per batch, ``items`` as :func:`pack` made
    them: the relay passes items and results on as they came, without
    unpickling them.  A batch for a lease of this worker goes
    straight to its mailbox; the others go over this worker's own connection
    pool, which Dask built with the cluster's ``Security`` (a TLS cluster's
    relays speak TLS), to the member's ``jc_batch``, which checks the map's
    secret as if the client had called.  A member that cannot be reached
    answers ``{"status": "unreachable", "connected": bool}`` (``connected``:
    the batch may have reached it before the connection broke), so the
    client treats it exactly as it treats its own broken connection.
    """
    here = worker.address
    pool = worker.rpc

    async def one(addr, lease_id, secret, run, items, budget):
        if addr == here:
            answer = await _batch(lease=lease_id, secret=secret, run=run, items=items, budget=budget)
        else:
            answer = await _ask_member(
                pool, addr, op="jc_batch", lease=lease_id, secret=secret, run=_wire(run),
                items=_forwardable(items), budget=budget,
            )  # fmt: skip
        if isinstance(answer, dict) and answer.get("result") is not None:
            answer = {**answer, "result": _forwardable(answer["result"])}
        return answer

    async def forward(addr, payload):
        if addr == here:
            return await _relayed(p=payload)
        return await _ask_member(pool, addr, op="jc_relayed", p=payload)

    if isinstance(entries, bytes):  # the usual case: (address, payload) pairs in one msgpack (pack_group)
        pairs = msgpack.unpackb(entries, use_list=False)
        answers = await asyncio.gather(*(forward(addr, payload) for addr, payload in pairs))
    else:
        group = entries.value if isinstance(entries, Packed) else entries
        answers = await asyncio.gather(*(one(*e) for e in group))
    return {"status": "ok", "answers": pack_answers(answers)}


async def _ask_member(pool, addr: str, **msg: Any) -> Any:
    """One request of a relay to a member worker; its answer, or "unreachable" (``connected``: whether it was)."""
    from distributed.core import send_recv

    try:
        c = await pool.connect(addr, timeout=RELAY_CONNECT_TIMEOUT_SECONDS)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - every way of not connecting is the same here
        return {"status": "unreachable", "connected": False, "error": f"{type(exc).__name__}: {exc}"}
    try:
        return await send_recv(comm=c, **msg)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - the member died or its connection broke
        return {"status": "unreachable", "connected": True, "error": f"{type(exc).__name__}: {exc}"}
    finally:
        pool.reuse(addr, c)


async def _relayed(comm=None, p=None):
    """``jc_batch`` for a batch a relay forwarded: its fields in one msgpack (:func:`pack_group`)."""
    lease, secret, run, items, budget = msgpack.unpackb(p, use_list=False)
    return await _batch(lease=lease, secret=secret, run=run, items=items, budget=budget)


def pack_group(entries: list[tuple]) -> Any:
    """A relay group's entries, ``(address, lease, secret, run, items, budget)`` each, for the ``jc_relay`` message.

    When every batch's items are bytes (:func:`pack`), each batch becomes
    one msgpack payload that the relay forwards as it is (``jc_relayed``),
    and the group one msgpack of ``(address, payload)`` pairs.  Dask walks
    a message's lists, tuples and dicts to estimate its size before sending
    it and msgpack walks them again (measured: 170 µs for a group of 32
    batches on the client, 25 µs for each member's message on its relay),
    against a few µs for bytes.  msgpack, not pickle: nothing is unpickled
    before the lease's secret is checked.  Otherwise (items that travel as
    frames) the plain list, which Dask sends without copying their buffers.
    """
    if not all(isinstance(e[4], bytes) for e in entries):
        return entries
    try:
        pairs = [
            (addr, msgpack.packb((lease, secret, run, items, budget), use_bin_type=True))
            for addr, lease, secret, run, items, budget in entries
        ]
        return msgpack.packb(pairs, use_bin_type=True)
    except (TypeError, ValueError):  # a run that msgpack cannot take (not made by MapJob): the plain list
        return entries


def pack_answers(answers: list) -> Any:
    """A relay's answers as one msgpack (as :func:`pack_group`), or the list when a result travels as frames."""
    try:
        return msgpack.packb(answers, use_bin_type=True)
    except (TypeError, ValueError):
        return answers


def unpack_answers(answers: Any) -> list:
    """The list of answers :func:`pack_answers` made, once received."""
    if isinstance(answers, bytes):
        return msgpack.unpackb(answers)
    return getattr(answers, "value", answers)


def _wire(run: Any) -> Any:
    """A map's ``run`` tuple as sent over the comm (plain msgpack: its function, if any, is bytes already)."""
    return run.value if isinstance(run, Packed) else run


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


def warm_up() -> bool:
    """Import what a worker's first batch needs and nothing has imported yet (a no-op task at cluster start).

    The telemetry modules (a batch flushes its reports through them) cost a
    new worker about 10 ms on the first map otherwise; they are not preloaded
    in the fork server because their per-process source id is drawn at import.
    """
    import jupyter_cluster.telemetry  # noqa: F401

    return True


def install(worker) -> None:
    """Register the engine's comm handlers on ``worker`` (idempotent)."""
    worker.handlers.setdefault("jc_attach", _attach)
    worker.handlers.setdefault("jc_batch", _batch)
    # Bound to its worker: a process may host several workers (get_worker() would not say which).
    worker.handlers.setdefault("jc_relay", functools.update_wrapper(functools.partial(_relay, worker), _relay))
    worker.handlers.setdefault("jc_relayed", _relayed)
    worker.handlers.setdefault("jc_close", _close)
    worker.handlers.setdefault("jc_ping", _ping)


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
        idle = [
            ls
            for ls in reg.leases.values()
            if ls.worker is worker and not ls.closed and not ls.busy and ls.mailbox.empty()
        ]
        # A lease whose batch has just ended is between two batches of an active map while its
        # client's next batch is on the way (the first round sends one per lease): it is looked
        # at again once that round trip has had its time.
        between = [ls for ls in idle if ls.last_end > recent]
        if between:
            idle = [ls for ls in idle if ls.last_end <= recent]
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


class EnginePlugin(WorkerPlugin):
    """Registers the direct path's comm handlers on every worker, and makes idle leases yield at once.

    Its :meth:`transition` hook sees every task that starts waiting for a
    thread on the worker (ready, or constrained by resources) and has the
    worker's idle leases give theirs up within milliseconds
    (:func:`_make_room`); it also wakes a lease whose task was cancelled (its
    client closed or was killed), so the thread is free at once.
    """

    name = PLUGIN_NAME
    idempotent = True

    def __init__(self):
        self.worker = None

    def setup(self, worker) -> None:
        self.worker = worker
        install(worker)

    def teardown(self, worker) -> None:
        # The worker is closing (or the plugin removed): its leases look at once whether to end.
        with _REGISTRY.lock:
            mine = [ls for ls in _REGISTRY.leases.values() if ls.worker is worker]
        for ls in mine:
            ls.mailbox.put(_WAKE)

    def transition(self, key, start, finish, **kwargs) -> None:
        # Called for every transition of every task on the worker, on its event loop: kept cheap.
        reg = _REGISTRY
        if (not reg.leases and not reg.early) or self.worker is None:
            return
        if finish in ("ready", "constrained"):
            if key in reg.early:  # a lease with an early batch: queued, or about to run (looked at after this pass)
                self.worker.loop.add_callback(_bounce_early, key)
            _ask_room(self.worker)
        elif start == "executing" and finish != "memory":
            ls = reg.leases.get(key)
            if ls is not None:  # cancelled (its client closed or went away): end now, not at the next check
                ls.mailbox.put(_WAKE)


def lease(lease_id: str, secret: str, big: dict | None = None) -> int:
    """The lease task: run batches from the mailbox until ended; returns the number of batches run.

    A lease serves one client (``secret``) and may serve several of its maps
    in turn: each batch names its map's function (see :func:`_batch`).
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
        for run, items, budget, fut, sent_secret in reg.early.pop(lease_id, []):
            if _matches(me, sent_secret):
                me.mailbox.put((run, items, budget, fut))
            else:
                refused.append(fut)
    for fut in waiting:
        loop.call_soon_threadsafe(_set, fut, me)
    for fut in refused:
        loop.call_soon_threadsafe(_set, fut, "refused")
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
                entry = me.mailbox.get(timeout=IDLE_CHECK_SECONDS)
            except queue.Empty:
                if cancelled():
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
                ran = _run_entry(entry, big, loop)
            finally:
                me.last_end = time.monotonic()
                me.busy = False
            runs += ran
            if cancelled() or _took_stop():  # a terminated pool's lease ends, as its processes would
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
                loop.call_soon_threadsafe(_set, entry[-1], None)
        me.ended = True


def _run_entry(entry: tuple, big: dict | None, loop) -> int:
    """Run one batch from a lease's mailbox and answer its ``jc_batch`` call; 1 if it ran, 0 if not."""
    run, items, budget, fut = entry
    token, blob, star, options = run.value if isinstance(run, Packed) else run
    if isinstance(items, Packed):
        items = items.value
    if blob is None and token not in _STATE.cache and not (big and "__fn__" in big):
        loop.call_soon_threadsafe(_set, fut, "need-fn")  # evicted from the cache: the client resends it
        return 0
    opts = options if budget is None else {**options, "budget": budget}
    result = run_chunk(token, blob, big, items, star, opts)
    loop.call_soon_threadsafe(_set, fut, result)
    return 1


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
    if packed.budget is not None:
        options = {**options, "budget": packed.budget}
    return run_chunk(token, blob, big, packed.items, star, options)


# =====================================================================================
# Running items: the worker half of a map (moved here from cellfunc.py)
# =====================================================================================
_CANCEL_CHECK_S = 0.05
#: Most characters of printed output kept per item (the rest is counted and dropped).
MAX_OUTPUT_CHARS = 1_000_000


class PreparedCell:
    """A compiled cell with its captured values, as cached on a worker."""

    def __init__(self, code, values: dict[str, Any], persistent: bool):
        self.code = code
        self.values = values
        self.persistent = persistent

    def bind(self, big: dict[str, Any] | None) -> Callable[[Any], Any]:
        """A per-item callable; ``big`` holds the large values sent once per worker."""
        code = self.code
        base = dict(worker_namespace()) if not self.persistent else None
        captured = dict(self.values)
        if big:
            captured.update(big)
        if self.persistent:
            ns = worker_namespace()

            def run_persistent(item):
                ns.update(captured)
                ns[ITEM_NAME] = item
                try:
                    exec(code, ns)
                    return ns.pop(RESULT_NAME, None)
                finally:
                    ns.pop(ITEM_NAME, None)
                    ns.pop(RESULT_NAME, None)

            return run_persistent
        assert base is not None  # made above for a cell that is not persistent
        base.update(captured)
        base.setdefault("__name__", "__main__")

        def run(item):
            ns = base.copy()
            ns[ITEM_NAME] = item
            exec(code, ns)
            return ns.get(RESULT_NAME)

        return run


# -- worker process state ----------------------------------------------------------
class _WorkerState:
    """State that lives as long as the worker process."""

    def __init__(self):
        self.namespace: dict[str, Any] = {"__name__": "__main__"}
        self.cache: OrderedDict[str, Any] = OrderedDict()
        self.lock = threading.Lock()
        self.local = threading.local()
        self.streams_installed = False


_STATE = _WorkerState()


def worker_namespace() -> dict[str, Any]:
    """The worker process's persistent namespace (filled by ``--all-workers`` cells)."""
    return _STATE.namespace


class _Capture:
    """One item's captured output; the buffer is made on the first write.

    Most items print nothing, and a ``StringIO`` per item was half of the
    worker's cost per no-op item.
    """

    __slots__ = ("buf", "size")

    def __init__(self):
        self.buf = None
        self.size = 0

    def write(self, s: str) -> int:
        if self.buf is None:
            self.buf = io.StringIO()
        n = len(s)
        if self.size < MAX_OUTPUT_CHARS:
            room = MAX_OUTPUT_CHARS - self.size
            self.buf.write(
                s
                if n <= room
                else s[:room] + f"\n[jupyter_cluster: output beyond {MAX_OUTPUT_CHARS:,} characters dropped]\n"
            )
        self.size += n
        return n

    def clear(self) -> None:
        """Forget what was written (a retried item keeps only its last attempt's output)."""
        self.buf = None
        self.size = 0

    def getvalue(self) -> str:
        return self.buf.getvalue() if self.buf is not None else ""


class ThreadStream(io.TextIOBase):
    """Sends writes to the current thread's capture buffer (``local.buf``), or to the real stream."""

    def __init__(self, real, local: threading.local):
        self._real = real
        self._local = local

    def write(self, s):
        cap = getattr(self._local, "buf", None)
        if cap is not None:
            return cap.write(s)
        return self._real.write(s)

    def flush(self):
        if getattr(self._local, "buf", None) is None:
            self._real.flush()

    def __getattr__(self, name):
        return getattr(self._real, name)


def install_thread_streams(state: Any) -> None:
    """Wrap ``sys.stdout``/``sys.stderr`` once per process for ``state`` (its ``local``, ``lock``
    and ``streams_installed``), so a thread that sets ``state.local.buf`` captures its own prints.

    Per-thread redirection: a worker with several threads runs several items (or a
    ``%%spmd`` rank beside map items) at once, and contextlib.redirect_stdout would mix
    their output.
    """
    with state.lock:
        if not state.streams_installed:
            sys.stdout = ThreadStream(sys.stdout, state.local)
            sys.stderr = ThreadStream(sys.stderr, state.local)
            state.streams_installed = True


def load(token: str, blob: bytes | None, big: dict[str, Any] | None):
    """The callable for ``token``: unpickled (and prepared) once per worker process."""
    with _STATE.lock:
        obj = _STATE.cache.get(token)
        if obj is not None:
            _STATE.cache.move_to_end(token)
    if obj is None:
        if blob is not None:
            obj = cloudpickle.loads(blob)
        else:
            assert big is not None  # the function itself travelled among the large values
            obj = big.pop("__fn__")
        if isinstance(obj, CellFunction):
            obj = obj.prepare()  # compiled, modules imported, small values unpickled: once per process
        with _STATE.lock:
            _STATE.cache[token] = obj
            while len(_STATE.cache) > 16:
                _STATE.cache.popitem(last=False)
    if isinstance(obj, PreparedCell):
        return obj.bind({k: v for k, v in (big or {}).items() if k != "__fn__"})
    return obj


# -- errors as data ----------------------------------------------------------------------
def _cell_tb(tb):
    """Skip our own frames: start the traceback at the first frame of the cell or the user's function."""
    first = tb
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_filename != __file__:
            return tb
        tb = tb.tb_next
    return first


def _add_first_lines(frames: dict | None, tb) -> None:
    """Record what tblib leaves out of each frame's code and the notebook needs to show it.

    ``co_firstlineno`` (IPython's renderer in a kernel counts a frame's
    context lines from it), ``co_qualname`` and the parameter names (its
    ``in f(x)`` heading).
    """
    while frames is not None and tb is not None:
        code = tb.tb_frame.f_code
        info = frames["tb_frame"]["f_code"]
        info["co_firstlineno"] = code.co_firstlineno
        info["co_qualname"] = getattr(code, "co_qualname", code.co_name)
        n, k = code.co_argcount, code.co_kwonlyargcount
        names = code.co_varnames
        info["co_params"] = {
            "args": list(names[:n]),
            "kwonly": list(names[n : n + k]),
            "varargs": names[n + k] if code.co_flags & 0x04 else None,
            "varkw": names[n + k + bool(code.co_flags & 0x04)] if code.co_flags & 0x08 else None,
        }
        frames, tb = frames.get("tb_next"), tb.tb_next


def error_info(exc: BaseException) -> tuple:
    """``(exception or None, type name, message, traceback text, frames dict or None)``."""
    tb = _cell_tb(exc.__traceback__)
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    try:
        pickle.dumps(exc)
        sendable = exc
    except Exception:
        try:
            cloudpickle.dumps(exc)
            sendable = exc
        except Exception:
            sendable = None
    frames = None
    try:
        from tblib import Traceback

        frames = Traceback(tb).to_dict() if tb is not None else None
    except Exception:  # tblib is optional; the text is enough
        frames = None
    _add_first_lines(frames, tb)
    return (sendable, type(exc).__qualname__, str(exc), text, frames)


class ItemTimeout(TimeoutError):
    """Raised for an item that ran longer than ``timeout`` seconds."""


def _async_raise(thread: threading.Thread, exc_type) -> None:
    import ctypes

    if thread.ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(exc_type))


class _TimedRunner:
    """Runs items in a helper thread so an item over its time limit can be abandoned."""

    def __init__(self, timeout: float):
        self.timeout = timeout
        self.thread = None
        self.jobs = None

    def _start(self):
        import queue

        self.jobs = queue.Queue()
        self.thread = threading.Thread(target=self._loop, args=(self.jobs,), daemon=True, name="jupyter-cluster-item")
        self.thread.start()

    def _loop(self, jobs):
        while True:
            job = jobs.get()
            if job is None:
                return
            call, args, done, box, buf = job
            _STATE.local.buf = buf
            try:
                box.append((True, call(*args)))
            except BaseException as exc:  # noqa: BLE001 - every item failure is data
                box.append((False, exc))
            finally:
                _STATE.local.buf = None
                done.set()

    def run(self, call, args, buf):
        if self.thread is None:
            self._start()
        done, box = threading.Event(), []
        self.jobs.put((call, args, done, box, buf))
        if not done.wait(self.timeout):
            # Abandon the thread: ask it to stop (Python code stops at once, a
            # blocking C call when it returns) and use a fresh one next time.
            _async_raise(self.thread, ItemTimeout)
            self.jobs.put(None)
            self.thread = None
            raise ItemTimeout(f"the item ran longer than the --timeout of {self.timeout:g} s")
        ok, value = box[0]
        if ok:
            return value
        raise value

    def close(self):
        if self.thread is not None:
            self.jobs.put(None)


class GroupStopped(BaseException):
    """Raised in work of a stop group that was stopped (``Pool.terminate()``).

    A ``BaseException``, as ``KeyboardInterrupt`` is, so that a task's own
    ``except Exception`` does not swallow it.
    """


class _Group:
    """One stop group on this worker: whether it was stopped, and the calls of it that run now."""

    __slots__ = ("stopped", "running")

    def __init__(self):
        self.stopped = threading.Event()
        # helper thread -> the event its waiting task thread sleeps on
        self.running: dict[threading.Thread, threading.Event] = {}


#: Stop groups seen by this worker process, newest last.  Bounded: a group is only needed while its
#: pool's work can still arrive, and every ``with Pool():`` block stops one.
_GROUPS: OrderedDict[str, _Group] = OrderedDict()
_GROUPS_LOCK = threading.Lock()
MAX_GROUPS = 10_000


def _group(name: str) -> _Group:
    with _GROUPS_LOCK:
        group = _GROUPS.get(name)
        if group is None:
            group = _GROUPS[name] = _Group()
            while len(_GROUPS) > MAX_GROUPS:
                _GROUPS.popitem(last=False)
        return group


def stop_group(name: str) -> int:
    """Stop the work of group ``name`` on this worker now; returns how many calls were running.

    Run on the worker's event loop (``run_on_every_worker``) by
    ``Pool.terminate()``.  Work of the group that arrives later stops at once.
    Each running call's task thread is woken and returns, so Dask has that
    thread back at once, as ``multiprocessing`` has its processes back when it
    ends them; the helper thread that ran the call gets :class:`GroupStopped`
    raised in it (Python code stops at once, a blocking C call such as
    ``time.sleep`` when it returns) and then ends.
    """
    group = _group(name)
    group.stopped.set()
    with _GROUPS_LOCK:
        running = list(group.running.items())
    for thread, woken in running:
        _async_raise(thread, GroupStopped)
        woken.set()
    return len(running)


class _GroupRunner:
    """This task thread's helper thread, which runs calls of stop groups so that they can be abandoned.

    One per task thread, reused from call to call (a handoff costs about
    what an ``Event`` round trip costs, once per chunk or apply); replaced
    when a stopped group abandons it.
    """

    def __init__(self):
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, daemon=True, name="jupyter-cluster-pool-item")
        self.thread.start()

    def _loop(self) -> None:
        from distributed.worker import thread_state

        while True:
            job = self.jobs.get()
            if job is None:
                return
            call, args, state, done, box = job
            # get_worker(), get_client() and the task's key work in the call as in its task thread.
            thread_state.__dict__.update(state)
            try:
                box.append((True, call(*args)))
            except BaseException as exc:  # noqa: BLE001 - handed to the task thread
                box.append((False, exc))
            finally:
                thread_state.__dict__.clear()
                done.set()


def run_in_group(name: str, call: Callable, *args: Any) -> Any:
    """``call(*args)`` as work of stop group ``name``: raises :class:`GroupStopped` once the group is stopped.

    The call runs in this task thread's helper thread while the task thread
    waits, so that :func:`stop_group` can give the task thread back to Dask
    at once, even when the call is blocked in C code.
    """
    from distributed.worker import thread_state

    group = _group(name)
    if group.stopped.is_set():
        raise GroupStopped(f"stop group {name} was stopped")
    local = _STATE.local
    runner = getattr(local, "group_runner", None)
    if runner is None:
        runner = local.group_runner = _GroupRunner()
    done: threading.Event = threading.Event()
    box: list = []
    with _GROUPS_LOCK:
        group.running[runner.thread] = done
    try:
        if group.stopped.is_set():  # stopped between the check above and the registration
            raise GroupStopped(f"stop group {name} was stopped")
        runner.jobs.put((call, args, dict(thread_state.__dict__), done, box))
        done.wait()
    finally:
        with _GROUPS_LOCK:
            group.running.pop(runner.thread, None)
    if group.stopped.is_set():
        # Woken by stop_group, or stopped as the call ended: GroupStopped may still land in the helper
        # (raised asynchronously), so it is not used again; it ends after its call, and a new one is made.
        runner.jobs.put(None)
        local.group_runner = None
        if not box:
            raise GroupStopped(f"stop group {name} was stopped")
    ok, value = box[0]
    if ok:
        return value
    raise value


def _took_stop() -> bool:
    """Whether the chunk this thread just ran was stopped by its group (and forget it)."""
    local = _STATE.local
    if getattr(local, "group_stopped", False):
        local.group_stopped = False
        return True
    return False


def _cancel_checker() -> Callable[[], bool]:
    """A cheap 'was this task cancelled?' test, checked between items."""
    try:
        from distributed import get_worker

        worker = get_worker()
        key = worker.get_current_task()
    except Exception:  # not on a worker (tests, local execution)
        return lambda: False

    def cancelled() -> bool:
        ts = worker.state.tasks.get(key)
        return ts is None or ts.state not in ("executing", "long-running")

    return cancelled


def _worker_address() -> str | None:
    try:
        from distributed import get_worker

        return get_worker().address
    except Exception:
        return None


def run_chunk(
    token: str, blob: bytes | None, big: dict[str, Any] | None, items: list, star: bool, options: dict
) -> tuple:
    """Run one chunk of items on a worker.

    Parameters
    ----------
    token : str
        Cache key of the function (the map's id).
    blob : bytes or None
        cloudpickle of the function or :class:`CellFunction`; None when it
        travels in ``big["__fn__"]`` because it is large.
    big : dict or None
        Large values, sent once per worker (Dask resolves them to local data).
    items : list
        The chunk's items (argument tuples when ``star``).
    star : bool
        Call ``fn(*item)`` instead of ``fn(item)``.
    options : dict
        ``retries`` (int), ``timeout`` (float or None), ``capture`` (bool),
        ``budget`` (float or None: stop after the item that takes the chunk
        past this many seconds; the engine sends the items left over again).

    Returns
    -------
    tuple
        ``(values, durations, outputs, errors, worker, started)``: ``outputs`` maps
        position -> printed text, ``errors`` maps position -> :func:`error_info`
        (None when empty); ``started`` is the chunk's ``time.time()`` start.
        Fewer values than items means the chunk stopped early (its budget ran
        out, or its task was cancelled).
    """
    started = time.time()
    retries = options.get("retries", 0)
    timeout = options.get("timeout")
    capture = options.get("capture", True)
    budget = options.get("budget")
    worker = _worker_address()
    big = dict(big) if big else None
    try:
        fn = load(token, blob, big)
    except BaseException as exc:  # noqa: BLE001 - a setup failure is reported for every item
        info = error_info(exc)
        return ([None] * len(items), [0.0] * len(items), None, {i: info for i in range(len(items))}, worker, started)
    if capture:
        install_thread_streams(_STATE)
    cancelled = _cancel_checker()
    runner = _TimedRunner(timeout) if timeout else None
    perf = time.perf_counter
    values: list = []
    durations: list = []
    outputs: dict[int, str] = {}
    errors: dict[int, tuple] = {}
    t_begin = perf()
    next_check = t_begin + _CANCEL_CHECK_S
    deadline = t_begin + budget if budget else float("inf")
    group = getattr(fn, "stop_group", None)  # a Pool's task: terminate() stops it (run_in_group)
    stop = _group(group).stopped if group is not None else None
    loop_args = (fn, items, star, retries, capture, runner, cancelled, next_check, deadline, stop)
    if group is None:
        _run_items(*loop_args, values, durations, outputs, errors)
    else:
        try:
            run_in_group(group, _run_items, *loop_args, values, durations, outputs, errors)
        except GroupStopped:
            _STATE.local.group_stopped = True  # the lease running this chunk ends (see _took_stop)
            # The helper may still be adding the item it was in: keep what was complete.
            n = min(len(values), len(durations))
            values, durations = values[:n], durations[:n]
            errors = {p: e for p, e in list(errors.items()) if p < n}
            outputs = {p: t for p, t in list(outputs.items()) if p < n}
    _check_results(values, errors, getattr(fn, "check_result", None))
    return (values, durations, outputs or None, errors or None, worker, started)


def _run_items(
    fn: Callable,
    items: list,
    star: bool,
    retries: int,
    capture: bool,
    runner: _TimedRunner | None,
    cancelled: Callable[[], bool],
    next_check: float,
    deadline: float,
    stop: threading.Event | None,
    values: list,
    durations: list,
    outputs: dict,
    errors: dict,
) -> None:
    """:func:`run_chunk`'s loop over its items (appends to ``values``, ``durations``, ``outputs``, ``errors``)."""
    local = _STATE.local  # per thread: run_in_group runs this in a helper thread
    perf = time.perf_counter
    try:
        for pos, item in enumerate(items):
            if stop is not None and stop.is_set():  # Pool.terminate(): the rest of the chunk is not run
                break
            args = item if star else (item,)
            buf = _Capture() if capture else None
            t0 = perf()
            stopped = False
            for attempt in range(retries + 1):
                if attempt:
                    # A retry storm (retries=10**9 on an item that always
                    # raises) must still stop when the map is cancelled, and
                    # its output must stay bounded: only the last attempt's is kept.
                    if perf() >= next_check:
                        next_check = perf() + _CANCEL_CHECK_S
                        if cancelled():
                            stopped = True
                            break
                    if buf is not None:
                        buf.clear()
                        buf.write(f"--- retry {attempt} of {retries} ---\n")
                try:
                    if runner is not None:
                        value = runner.run(fn, args, buf)
                    else:
                        local.buf = buf
                        try:
                            value = fn(*args)
                        finally:
                            local.buf = None
                except BaseException as exc:  # noqa: BLE001 - every item failure is data
                    if attempt < retries and not isinstance(exc, ItemTimeout):
                        continue
                    errors[pos] = error_info(exc)
                    value = None
                break
            if stopped:  # cancelled between retries: the item counts as not run
                break
            t1 = perf()
            values.append(value)
            durations.append(t1 - t0)
            if buf is not None:
                text = buf.getvalue()
                if text:
                    outputs[pos] = text
            if t1 >= deadline:
                break
            if t1 >= next_check:
                next_check = t1 + _CANCEL_CHECK_S
                if cancelled():
                    break
    finally:
        if runner is not None:
            runner.close()


#: Result types Dask can always send back; a chunk holding only these skips the check.
_SENDABLE = frozenset({type(None), bool, int, float, complex, str, bytes})


def _check_results(values: list, errors: dict, check: Callable[[Any], BaseException | None] | None = None) -> None:
    """Replace results that cannot be sent back by an error for that item.

    Pickling every chunk's values here doubled the cost of large results, so
    scalars are trusted and only chunks holding something else are tried.
    ``check(value)``, when the function has one (a ``Pool``'s task: its own
    rules and error, ``MaybeEncodingError``), says what is wrong with a value.
    """
    sendable = _SENDABLE
    if all(type(v) in sendable for v in values):
        return
    if check is not None:
        for pos, value in enumerate(values):
            if type(value) not in sendable and pos not in errors:
                problem = check(value)
                if problem is not None:
                    errors[pos] = error_info(problem)
                    values[pos] = None
        return
    try:
        pickle.dumps(values, protocol=5, buffer_callback=lambda b: None)
        return
    except Exception:
        pass
    for pos, value in enumerate(values):
        try:
            cloudpickle.dumps(value, protocol=5, buffer_callback=lambda b: None)
        except Exception as exc:
            err = TypeError(
                f"the item's result ({type(value).__qualname__}) cannot be sent back to the notebook: {exc}; return something picklable (e.g. a list instead of a generator)."
            )
            errors[pos] = error_info(err)
            values[pos] = None
