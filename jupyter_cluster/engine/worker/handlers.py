"""The comm handlers every worker of a cluster gets: the direct path's worker half.

The client puts batches in a lease's mailbox and gets results back over
Dask's comm, without the scheduler, by calling these handlers
(:class:`~..protocol.Op`), which :class:`EnginePlugin` registers on every
worker the way distributed's P2P shuffle registers its own.  A relay worker
forwards a group's batches to their leases (:func:`_relay`).
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from ..protocol import (
    Batch,
    Op,
    Packed,
    PackedResult,
    RelayEntry,
    Status,
    answer,
    forwardable,
    pack,
    pack_answers,
    unpack_group,
    unpack_relayed,
    wire_run,
)
from .groups import stop_group
from .registry import _REGISTRY, _WAKE, ATTACH_WAIT_SECONDS, Early, _ask_room, _matches, _queued, _set, report_busy

PLUGIN_NAME = "jupyter-cluster-engine"


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
            return answer(Status.WAITING)
    if found is False:
        return answer(Status.GONE)
    if not _matches(found, secret):
        return answer(Status.REFUSED)
    return answer(Status.READY)


async def _batch(comm=None, lease=None, secret=None, run=None, items=None, budget=None, wait=None):
    """Queue a batch on ``lease`` and answer with its result (or "gone" if the lease ended first).

    ``run`` is the map's :class:`.protocol.MapRun` as a msgpack array (``blob`` None once
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
            # Kept as it came: unpickled by the lease once it has checked the secret (lease._run_entry).
            early = Early(Batch(run, items, budget, fut), secret)
            reg.early.setdefault(lease, []).append(early)
        elif found is None or found.closed:
            return answer(Status.GONE)
        elif not _matches(found, secret):
            return answer(Status.REFUSED)
        else:
            # Kept as it came here too: unpickled by the lease's thread (lease._run_entry), not on the
            # worker's event loop while holding the registry's lock.
            found.mailbox.put(Batch(run, items, budget, fut))
    if early is not None:
        if _queued(lease) and _drop_early(lease, early):
            return answer(Status.WAITING)
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout=float(wait))
        except asyncio.TimeoutError:
            if _drop_early(lease, early):  # the lease never came for it: the client sends it elsewhere
                return answer(Status.WAITING)
        except asyncio.CancelledError:  # the caller's connection closed: nobody waits for it any more
            _drop_early(lease, early)
            raise
    result = await fut
    if result is None:  # the lease ended before it ran the batch
        return answer(Status.GONE)
    if isinstance(result, Status):  # NEED_FN, REFUSED, or WAITING (bounced by _bounce_early: queued here)
        return answer(result)
    from ...telemetry.producer import _producer, current_worker, flush_to_scheduler

    # The batch's reports reach the scheduler before its result reaches the client.  Looked up only
    # when there are some: finding the worker walks the process's workers (64 in benchmarks/scale_sim.py).
    if _producer.pending:
        worker = current_worker()
        if worker is not None:
            await flush_to_scheduler(worker)
    return answer(Status.OK, result=result.data if isinstance(result, PackedResult) else pack(result))


def _bounce_early(lease: str) -> None:
    """Answer "waiting" to the batches kept for ``lease`` if its task is queued (on the worker's loop)."""
    if not _queued(lease):
        return
    with _REGISTRY.lock:
        kept = _REGISTRY.early.pop(lease, [])
    for entry in kept:
        _set(entry.batch.reply, Status.WAITING)


def _drop_early(lease: str, early: Early) -> bool:
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


#: Longest wait for a relay's connection to a member worker, in seconds (as the client's own, engine.cluster).
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
    answers ``Status.UNREACHABLE`` with ``connected`` (whether the
    batch may have reached it before the connection broke), so the
    client treats it exactly as it treats its own broken connection.
    """
    here = worker.address
    pool = worker.rpc

    async def one(e: RelayEntry):
        if e.addr == here:
            got = await _batch(lease=e.lease, secret=e.secret, run=e.run, items=e.items, budget=e.budget)
        else:
            got = await _ask_member(
                pool, e.addr, op=Op.BATCH, lease=e.lease, secret=e.secret, run=wire_run(e.run),
                items=forwardable(e.items), budget=e.budget,
            )  # fmt: skip
        if isinstance(got, dict) and got.get("result") is not None:
            got = {**got, "result": forwardable(got["result"])}
        return got

    async def forward(addr, payload):
        if addr == here:
            return await _relayed(p=payload)
        return await _ask_member(pool, addr, op=Op.RELAYED, p=payload)

    if isinstance(entries, bytes):  # the usual case: (address, payload) pairs in one msgpack (pack_group)
        pairs = unpack_group(entries)
        answers = await asyncio.gather(*(forward(addr, payload) for addr, payload in pairs))
    else:
        group = entries.value if isinstance(entries, Packed) else entries
        answers = await asyncio.gather(*(one(RelayEntry._make(e)) for e in group))
    return answer(Status.OK, answers=pack_answers(answers))


async def _ask_member(pool, addr: str, **msg: Any) -> Any:
    """One request of a relay to a member worker; its answer, or "unreachable" (``connected``: whether it was)."""
    from distributed.core import send_recv

    try:
        c = await pool.connect(addr, timeout=RELAY_CONNECT_TIMEOUT_SECONDS)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - every way of not connecting is the same here
        return answer(Status.UNREACHABLE, connected=False, error=f"{type(exc).__name__}: {exc}")
    try:
        return await send_recv(comm=c, **msg)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - the member died or its connection broke
        return answer(Status.UNREACHABLE, connected=True, error=f"{type(exc).__name__}: {exc}")
    finally:
        pool.reuse(addr, c)


async def _relayed(comm=None, p=None):
    """``jc_batch`` for a batch a relay forwarded: its fields in one msgpack (:func:`.protocol.pack_group`)."""
    r = unpack_relayed(p)
    return await _batch(lease=r.lease, secret=r.secret, run=r.run, items=r.items, budget=r.budget)


async def _close(comm=None, lease=None, secret=None, wait=0.0):
    """End ``lease`` now (the map is over), instead of when it next sees that Dask cancelled it.

    With ``wait`` > 0, answer once the lease's task has returned (at most
    ``wait`` seconds): a cluster about to close then finds no task to cut off.
    """
    found = _REGISTRY.leases.get(lease)
    if found is not None and _matches(found, secret):
        found.mailbox.put(None)
        if found.busy:  # its map stopped: the batch it runs is nobody's now (lease._run_entry)
            stop_group(lease)
        deadline = asyncio.get_running_loop().time() + float(wait)
        # `ended` is set by the lease's own thread; an asyncio.Event may not be set from there
        while not found.ended and asyncio.get_running_loop().time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.005)
    return "OK"


async def _ping(comm=None):
    return "jupyter-cluster-engine"


def install(worker) -> None:
    """Register the engine's comm handlers on ``worker``, and its busy-lease metric (idempotent)."""
    report_busy(worker)  # the server tells working leases from idle ones by it
    worker.handlers.setdefault(Op.ATTACH, _attach)
    worker.handlers.setdefault(Op.BATCH, _batch)
    # Bound to its worker: a process may host several workers (get_worker() would not say which).
    worker.handlers.setdefault(Op.RELAY, functools.update_wrapper(functools.partial(_relay, worker), _relay))
    worker.handlers.setdefault(Op.RELAYED, _relayed)
    worker.handlers.setdefault(Op.CLOSE, _close)
    worker.handlers.setdefault(Op.PING, _ping)


class EnginePlugin(WorkerPlugin):
    """Registers the direct path's comm handlers on every worker, and makes idle leases yield at once.

    Its :meth:`transition` hook sees every task that starts waiting for a
    thread on the worker (ready, or constrained by resources) and has the
    worker's idle leases give theirs up within milliseconds
    (:func:`.registry._make_room`); it also wakes a lease whose task was cancelled (its
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
