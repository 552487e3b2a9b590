"""The direct path: leases placed through Dask, batches sent to them over Dask's comm.

:class:`Leases` places one lease task (:func:`.worker.lease.lease`) per worker
thread a map may use, pinned to the worker the client chose from the
scheduler's list, with the map's resources (so Dask still checks them and
counts the thread as busy).  Pinning tells the client where each lease runs
without another scheduler message, and lets a lease lost with its worker be
replaced on a live worker instead of queuing behind a busy thread.  A new
lease is sent its first batch right away, which its worker keeps until the
lease starts (:meth:`Leases.room`); once it answers ``jc_attach`` it takes
batches at full depth: each batch is one
``jc_batch`` request (:func:`.cluster.call`) on the client's own connection
pool (built with the client's ``connection_args``, so a TLS cluster stays
TLS), at most :data:`DEPTH` per lease, so a lease always has its next batch
queued.  Everything that happens (a lease ready, a batch's result, a lost
connection, a lease task that ended) arrives on one thread-safe queue that
the map's thread reads (:meth:`Leases.poll`).

A map that ends hands its leases to its client's :class:`LeasePool`, which
keeps them ``jupyter-cluster.engine.linger`` (:data:`LINGER_SECONDS`, 60 s)
so that the next map of the same client with the same resources starts at
once, with no scheduler round trip: a loop of short maps places its leases
once, and a cell run again within a minute starts its first item in about
2-3 ms instead of 9 ms or more through the scheduler (``benchmarks/first_item.py``).
Keeping them costs other work no thread: a task that waits for a thread on
a lease's worker makes an idle lease give its own up at once
(:class:`.worker.EnginePlugin`).  They still end after ``engine.linger``,
since Dask counts a lease as a running task: the dashboard shows it
processing, a worker running one never looks idle to adaptive scaling (and
the lease's long run inflates Dask's duration estimate for ``jc-lease``
tasks), and with ``distributed.scheduler.worker-saturation: 1.0`` a large
``client.map`` of other work stays queued on the scheduler until they end.
Closing a cluster ends them first (:func:`release_leases`); a worker that
closes (scaling down) wakes its own, which end at once.
A map that captured large values places its own leases (Dask hands them the
values) and ends them."""

from __future__ import annotations

import asyncio
import concurrent.futures
import heapq
import itertools
import logging
import math
import queue
import secrets
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from distributed import Client

from .. import config
from ..errors import ClusterError
from . import planner
from .cluster import (
    ConnectFailed,
    cached_threads,
    call,
    client_loop,
    client_running,
    direct_reachable,
    future_error,
    is_killed_worker,
    on_client_loop,
    scheduler_workers,
    worker_slots,
)
from .demand import Demand
from .dispatch import Chunk, Counters, Died, Done, Failed, Fallback, MapEvent, Retry
from .protocol import ChunkResult, MapRun, Op, RelayEntry, Status, pack, pack_group, unpack, unpack_answers
from .worker import lease
from .worker.registry import ATTACH_WAIT_SECONDS, EARLY_WAIT_SECONDS

logger = logging.getLogger(__name__)

#: Batches sent to one lease and not yet answered: one running, one queued.
DEPTH = 2
#: Batches of this many workers travel in one relay message (the probe's group size, ../shared/engine-probe).
RELAY_GROUP = 32
#: A round of batches reaching at least this many workers goes through relays (config ``engine.relay-min-workers``).
RELAY_MIN_WORKERS = 64
#: How long a client's idle leases wait for its next map when ``engine.linger`` is not configured, in seconds.
LINGER_SECONDS = 60.0

#: A map looks at the scheduler's workers (to place and replace leases) this often, in seconds.
PLACE_EVERY_SECONDS = 2.0
#: While waiting on the client's loop, look at the scheduler this often, in seconds.
WAIT_SLICE_SECONDS = 1.0

_lease_numbers = itertools.count()


@dataclass(frozen=True, slots=True)
class LeaseReady:
    """A lease answered its attach: it runs."""

    lease: Lease


@dataclass(frozen=True, slots=True)
class LeaseUnreached:
    """A lease's worker did not answer its attach (at most an early batch was sent)."""

    lease: Lease
    error: BaseException


@dataclass(frozen=True, slots=True)
class LeaseEnded:
    """A lease task ended without us ending it."""

    lease: Lease


@dataclass(frozen=True, slots=True)
class Answered:
    """A worker answered a batch (``answer``: the handler's dict, its ``status`` a :class:`.protocol.Status`)."""

    sent: Sent
    answer: dict


@dataclass(frozen=True, slots=True)
class Broken:
    """A batch's call failed (a broken connection, or items that could not be packed)."""

    sent: Sent
    error: BaseException


@dataclass(frozen=True, slots=True)
class RelayLost:
    """The relay carrying a batch failed; the batch's own worker may be fine."""

    sent: Sent
    error: BaseException


#: What the client's loop hears about a map's leases, queued for the map's thread (:meth:`Leases.poll`).
Heard = LeaseReady | LeaseUnreached | LeaseEnded | Answered | Broken | RelayLost


class Lease:
    """The client's record of one lease task."""

    __slots__ = (
        "id",
        "addr",
        "future",
        "ready",
        "dead",
        "outstanding",
        "owner",
        "tokens",
        "pooled",
        "idle_since",
        "hold",
        "early",
    )

    def __init__(self, lease_id: str, addr: str, future: Any, owner: Any, pooled: bool):
        self.id = lease_id
        self.addr = addr
        self.future = future
        self.ready = False
        self.dead = False
        self.outstanding: list = []  # Sent, oldest first (the lease runs them in this order)
        self.owner = owner  # the Leases (map) using it; None while idle in the pool
        self.tokens: set[str] = set()  # maps whose function this lease's worker process was sent
        self.pooled = pooled  # may serve the client's next map (it holds no map's large values)
        self.idle_since = 0.0
        self.hold = 0.0  # seconds it is kept once idle (set when given back)
        # May take one batch before it answers its attach (the worker keeps it for the lease); cleared
        # once such a batch came back "waiting" (the lease is queued behind other work there).
        self.early = True

    def failed(self) -> bool:
        """Whether the lease task ended with an error (its worker died, or it could not run)."""
        return self.future.status == "error"


class Sent:
    """One batch sent to one lease (a chunk sent again is a new ``Sent``)."""

    __slots__ = ("chunk", "lease", "handle")

    def __init__(self, chunk: Any, lease: Lease):
        self.chunk = chunk
        self.lease = lease
        self.handle = None  # concurrent.futures.Future of the RPC coroutine


class LeasePool:
    """A client's idle leases, kept ``engine.linger`` seconds for its next map; ends them after that.

    One per client (:func:`pool_for`); the secret that every lease of the
    client checks on each batch lives here.  Every map's leases are kept the
    same time, whatever the pause before it: keeping them costs the cluster
    no thread (:class:`.worker.EnginePlugin` makes them yield to any task that
    waits for one), so the first map after a long pause is kept as long as the
    tenth map of a loop.
    """

    def __init__(self, client: Client):
        self.client = client
        self.secret = secrets.token_hex(16)
        configured = config.get("engine.linger")
        self.linger = config.timeout_seconds("engine.linger") if configured is not None else LINGER_SECONDS
        self.lock = threading.Lock()
        self.idle: dict[tuple, list[Lease]] = {}
        self.timer: threading.Timer | None = None
        # The leases of this client's maps that have not ended: a cluster closing ends them first too.
        self.active: weakref.WeakSet[Leases] = weakref.WeakSet()

    def take(self, key: tuple, n: int) -> list[Lease]:
        """Up to ``n`` idle leases for resources ``key``, the most recently used first."""
        with self.lock:
            idle = self.idle.get(key, [])
            got: list[Lease] = []
            while idle and len(got) < n:
                ls = idle.pop()
                if not ls.dead and ls.future.status == "pending":
                    got.append(ls)
            return got

    def give(self, key: tuple, leases: list[Lease]) -> None:
        """Keep ``leases`` (idle now) for the client's next map with resources ``key``.

        A lease that has not answered its attach yet (placed late in its map,
        or queued behind a busy thread) is kept too: the map that adopts it
        asks again (:meth:`Leases.adopt`) and sends it work once it runs.
        Ending it instead made a map that outruns its own lease placement (a
        thousand workers on a loaded scheduler) place the same leases again
        every map, and about a tenth of the workers never got a batch.
        """
        now = time.monotonic()
        with self.lock:
            for ls in leases:
                ls.owner = None
                ls.idle_since = now
                ls.hold = self.linger
            self.idle.setdefault(key, []).extend(leases)
            if self.timer is None and self.linger > 0:
                self._arm(self.linger)
        if self.linger <= 0:
            self.reap()

    def _arm(self, delay: float) -> None:
        self.timer = threading.Timer(delay, self.reap)
        self.timer.daemon = True
        self.timer.start()

    def reap(self, everything: bool = False, wait: float = 0.0) -> None:
        """End the leases idle longer than ``engine.linger``, and those that ended by themselves (or all of them)."""
        now = time.monotonic()
        ending = []
        with self.lock:
            self.timer = None
            oldest = None
            for idle in self.idle.values():
                keep = []
                for ls in idle:
                    if everything or ls.dead or now - ls.idle_since >= ls.hold:
                        ending.append(ls)
                    else:
                        keep.append(ls)
                        due = ls.idle_since + ls.hold
                        oldest = due if oldest is None else min(oldest, due)
                idle[:] = keep
            if oldest is not None:
                self._arm(max(oldest - now, 0.01))
        end_leases(self.client, self.secret, ending, wait=wait)


def release_leases(client: Client) -> None:
    """End ``client``'s leases now, idle ones and those of maps still open (an unfinished ``imap``).

    Called before the client or its cluster closes, so that no task is cut
    off (Dask's "Async instruction ... ended with CancelledError" on the workers).
    """
    pool = getattr(client, "_jc_lease_pool", None)
    if pool is None:
        return
    ending = [ls for leases in list(pool.active) for ls in leases.live()]
    end_leases(client, pool.secret, ending, wait=1.0)
    pool.reap(everything=True, wait=1.0)


def pool_for(client: Client) -> LeasePool:
    pool = getattr(client, "_jc_lease_pool", None)
    if pool is None:
        pool = client._jc_lease_pool = LeasePool(client)  # type: ignore[attr-defined]
    return pool


def end_leases(client: Client, secret: str, leases: list[Lease], wait: float = 0.0) -> None:
    """End ``leases`` now: a ``jc_close`` to each (frees the thread at once) and Dask's cancel (frees it for sure).

    ``wait``: seconds to wait for the workers to take the ``jc_close`` (before a cluster closes).
    """
    if not leases:
        return
    loop = client_loop(client)
    futures, closing = [], []
    for ls in leases:
        if not ls.dead:
            sent = _schedule(_close(client, ls, secret, wait), loop)
            if sent is not None:
                closing.append(sent)
        ls.dead = True
        futures.append(ls.future)
    if wait > 0 and closing:
        concurrent.futures.wait(closing, timeout=wait)
    if getattr(client, "status", None) == "running":
        try:
            cancelled = client.cancel(futures, reason="jupyter-cluster lease ended")
        except TypeError:
            cancelled = client.cancel(futures)
        except Exception:  # noqa: BLE001 - the cluster may be gone
            logger.debug("cancelling leases failed", exc_info=True)
            return
        if asyncio.iscoroutine(cancelled):  # called on the client's own loop (a job collected there)
            _schedule(cancelled, loop)


def _schedule(coro: Any, loop: asyncio.AbstractEventLoop) -> concurrent.futures.Future | None:
    """Run ``coro`` on ``loop``; None, with ``coro`` closed unrun, where the loop is gone.

    A map collected after its cluster closed (an ``imap`` its caller dropped)
    otherwise left "coroutine '_close' was never awaited" on stderr.
    """
    if loop.is_closed():
        coro.close()
        return None
    try:
        return asyncio.run_coroutine_threadsafe(coro, loop)
    except RuntimeError:  # closed in the meantime
        coro.close()
        return None


async def _close(client: Client, ls: Lease, secret: str, wait: float = 0.0) -> None:
    try:
        await call(client, ls.addr, Op.CLOSE, lease=ls.id, secret=secret, wait=wait, reply=wait > 0)
    except Exception:  # noqa: BLE001 - Dask's cancellation ends the lease anyway
        pass


class Leases:
    """The leases of one map and the batches in flight to them.

    Parameters
    ----------
    client : distributed.Client
    map_id : str
        Names the lease tasks (``jc-lease-<map_id>-<n>``).
    resources : dict or None
        Dask resources each lease (thread) needs.
    limit : int or None
        Most leases at once (``Pool(processes=N)``); None: every thread that fits.
    run : MapRun
        The map's function and how to run it, sent whole with each batch
        (see :func:`.worker.handlers._batch`).
    big : dict or None
        The map's large values (scattered futures); a map with some places
        its own leases, which Dask hands the values, and ends them after.
    """

    def __init__(
        self,
        client: Client,
        map_id: str,
        resources: dict | None,
        limit: int | None,
        run: MapRun,
        big: dict | None = None,
    ):
        self.client = client
        self.map_id = map_id
        self.resources = resources
        self.key = tuple(sorted((resources or {}).items()))
        self.limit = limit
        self.run = run
        self.token = run.token
        self.big = big
        self.pool = pool_for(client)
        self.pool.active.add(self)
        self.secret = self.pool.secret
        self.events: queue.SimpleQueue = queue.SimpleQueue()
        self.leases: dict[str, Lease] = {}
        self.placed = 0
        self.reused = 0
        self.wanted = 0
        self.closed = False
        self.relayed = 0  # relay messages sent
        self.unattached: list[Lease] = []  # placed or adopted, their jc_attach not sent yet (attach_new)
        self.early_sent = 0  # batches sent to a lease before it attached (:meth:`room`)
        relay_min = config.get("engine.relay-min-workers")
        self.relay_min = RELAY_MIN_WORKERS if relay_min is None else int(relay_min)

    # -- leases -------------------------------------------------------------------------
    def live(self) -> list[Lease]:
        return [ls for ls in self.leases.values() if not ls.dead]

    def adopt(self, n: int) -> int:
        """Take up to ``n`` idle leases of an earlier map of this client; returns how many."""
        if self.big or n <= 0:
            return 0
        got = self.pool.take(self.key, n)
        for ls in got:
            ls.owner = self
            self.leases[ls.id] = ls
            if ls.future.done():  # ended between the pool's check and now
                self.events.put(LeaseEnded(ls))
            elif not ls.ready:  # its first map ended before it ran: this map asks for it
                self.unattached.append(ls)
        self.reused += len(got)
        return len(got)

    def place(self, workers: dict) -> list[Lease]:
        """Place leases on ``workers`` (``scheduler_info()["workers"]``) up to their free slots.

        Returns the leases of workers that are no longer in ``workers`` (lost
        with their worker; the caller deals with their batches).
        """
        gone = [ls for ls in self.live() if ls.addr not in workers]
        for ls in gone:
            self.kill(ls)
        slots = {
            addr: worker_slots(w, self.resources)
            for addr, w in workers.items()
            if w.get("status", "running") == "running"
        }
        total = sum(slots.values())
        self.wanted = total if self.limit is None else min(self.limit, total)
        # This client's idle leases (an earlier map's, or one's that ended while this map ran) hold
        # threads this map wants: take them up.  Counted against the slots but left idle, they made a
        # map whose own leases had ended wait until they ended too (engine.linger, 60 s).
        self.adopt(self.wanted - len(self.live()))
        used: dict[str, int] = {}
        for ls in self.live():
            used[ls.addr] = used.get(ls.addr, 0) + 1
        if not self.big:
            # Idle leases this map could not take (it has enough) count against their workers' slots.
            # A map with large values places leases of its own: idle ones yield their threads to them.
            with self.pool.lock:
                for ls in self.pool.idle.get(self.key, []):
                    if not ls.dead:
                        used[ls.addr] = used.get(ls.addr, 0) + 1
        room = {a: n - used.get(a, 0) for a, n in sorted(slots.items())}
        need = self.wanted - len(self.live())
        # Round robin over the workers, so a capped map spreads out.
        while need > 0 and any(v > 0 for v in room.values()):
            for addr in list(room):
                if need <= 0:
                    break
                if room[addr] > 0:
                    room[addr] -= 1
                    need -= 1
                    self._submit(addr)
        return gone

    def _submit(self, addr: str) -> None:
        lease_id = f"jc-lease-{self.map_id}-{next(_lease_numbers)}"
        kwargs: dict[str, Any] = {"key": lease_id, "pure": False, "workers": [addr], "allow_other_workers": False}
        if self.resources:
            kwargs["resources"] = self.resources
        fut = self.client.submit(lease, lease_id, self.secret, self.big, **kwargs)
        ls = Lease(lease_id, addr, fut, self, pooled=not self.big)
        self.leases[lease_id] = ls
        self.placed += 1
        fut.add_done_callback(lambda f, ls=ls: _lease_done(ls))
        self.unattached.append(ls)

    def attach_new(self) -> None:
        """Send the ``jc_attach`` of every lease placed or adopted since the last call.

        The map calls it after its first round of sends: a fresh lease's early
        batch then leaves the client before the attach, which the first item
        does not wait for (measured on a fresh 2-worker TLS cluster: the two
        attaches' connections ahead of the batches cost the first item ~2 ms).
        """
        todo, self.unattached = self.unattached, []
        for ls in todo:
            if not ls.dead and not ls.ready:
                self._run(self._attach(ls))

    async def _attach(self, ls: Lease) -> None:
        while not ls.dead and not self.closed:
            try:
                answer = await call(
                    self.client, ls.addr, Op.ATTACH, lease=ls.id, secret=self.secret, wait=ATTACH_WAIT_SECONDS
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the worker is gone or unreachable
                owner = ls.owner
                if owner is not None:
                    owner.events.put(LeaseUnreached(ls, exc))
                else:
                    ls.dead = True
                return
            status = Status.of(answer)
            if status is Status.READY:
                ls.ready = True
                owner = ls.owner
                if owner is not None:
                    owner.events.put(LeaseReady(ls))
                return
            if status is not Status.WAITING:
                _lease_done(ls)
                return
            if ls.future.done():
                return

    def kill(self, ls: Lease) -> None:
        """Give up on a lease (its worker left, or it ended): cancel its task; its batches are the caller's."""
        if ls.dead:
            return
        ls.dead = True
        ls.ready = False
        try:
            ls.future.cancel()
        except Exception:  # noqa: BLE001 - the client may be closing
            pass

    # -- batches ------------------------------------------------------------------------
    def free(self) -> list[Lease]:
        """Leases with room for another batch (:meth:`room`)."""
        return [ls for ls in self.leases.values() if self.room(ls) > 0]

    def room(self, ls: Lease) -> int:
        """How many more batches ``ls`` may be sent now.

        A ready lease: up to :data:`DEPTH` in flight.  One that has not
        answered its attach yet (just placed, or adopted before it ran): one
        *early* batch, which its worker keeps until the lease starts
        (``jc_batch`` with ``wait``), so a fresh map's first item does not
        wait for the attach's answer and another message.  Not through
        relays (rounds of ``relay_min`` workers or more), and not again for
        a lease whose early batch came back "waiting".
        """
        if ls.dead:
            return 0
        if ls.ready:
            return DEPTH - len(ls.outstanding)
        if not ls.early or ls.outstanding or len(self.leases) >= self.relay_min > 0:
            return 0
        return 1

    def send(self, ls: Lease, chunk: Any) -> Sent:
        """Send one batch to one lease (one RPC; an early one if the lease has not attached yet)."""
        sent = Sent(chunk, ls)
        ls.outstanding.append(sent)
        wait = None
        if not ls.ready:
            wait = EARLY_WAIT_SECONDS
            self.early_sent += 1
        sent.handle = self._run(self._send(sent, self._run_for(ls), wait))
        return sent

    def _run_for(self, ls: Lease) -> MapRun:
        """The map's run for a batch to ``ls``: with the function the first time its worker process gets it."""
        if self.token in ls.tokens:
            return self.run.without_function()
        ls.tokens.add(self.token)
        return self.run

    def send_many(self, pairs: list[tuple[Lease, Any]]) -> list[Sent]:
        """Send one round of batches (``(lease, chunk)`` pairs); returns their :class:`Sent`, in order.

        A round that reaches at least ``relay_min`` workers goes through
        relays: the workers are taken in groups of :data:`RELAY_GROUP`, and
        the client sends each group's batches in one ``jc_relay`` message to
        the group's first worker, which forwards them over its own
        connections and answers with all of them (:func:`.worker.handlers._relay`).
        One client tops out near 1,000 RPCs a second; relays make that one
        message per group.  Smaller rounds go straight to their leases.
        """
        addrs = sorted({ls.addr for ls, _ in pairs})
        if self.relay_min <= 0 or len(addrs) < self.relay_min:
            return [self.send(ls, chunk) for ls, chunk in pairs]
        group_of = {a: k // RELAY_GROUP for k, a in enumerate(addrs)}
        groups: dict[int, list[Sent]] = {}
        payloads: dict[int, Any] = {}
        out = []
        for ls, chunk in pairs:
            sent = Sent(chunk, ls)
            ls.outstanding.append(sent)
            out.append(sent)
            # Pickled here, on the map's thread (off the client's event loop), each batch apart: the
            # relay forwards the bytes as they are.
            try:
                payloads[id(sent)] = pack(chunk.items)
            except Exception as exc:  # noqa: BLE001 - items that cannot be pickled fail their batch, as sent directly
                self.events.put(Broken(sent, exc))
                continue
            groups.setdefault(group_of[ls.addr], []).append(sent)
        for k, sents in groups.items():
            # The lease's token set is the map thread's: the run tuples are built here too.
            entries = [
                RelayEntry(ls.addr, ls.id, self.secret, self._run_for(ls), payloads[id(sent)], sent.chunk.budget)
                for sent in sents
                for ls in (sent.lease,)
            ]
            handle = self._run(self._send_group(addrs[k * RELAY_GROUP], sents, entries))
            for sent in sents:
                sent.handle = handle
        self.relayed += len(groups)
        return out

    async def _send_group(self, relay: str, sents: list[Sent], entries: list[RelayEntry]) -> None:
        try:
            answer = await call(self.client, relay, Op.RELAY, entries=pack_group(entries))
            answers = unpack_answers(answer["answers"])
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - sorted out by the map's thread
            for sent in sents:
                # A batch of the relay's own worker is lost like a direct one; the others may be
                # running on live members: the map's thread sends them elsewhere.
                self.events.put(Broken(sent, exc) if sent.lease.addr == relay else RelayLost(sent, exc))
            return
        for sent, ans in zip(sents, answers):
            if Status.of(ans) is Status.UNREACHABLE:
                cls = OSError if ans.get("connected") else ConnectFailed
                self.events.put(
                    Broken(sent, cls(f"relay {relay} could not reach {sent.lease.addr}: {ans.get('error')}"))
                )
            else:
                self.events.put(Answered(sent, ans))

    async def _send(self, sent: Sent, run: MapRun, wait: float | None = None) -> None:
        ls = sent.lease
        extra = {} if wait is None else {"wait": wait}
        try:
            answer = await call(
                self.client, ls.addr, Op.BATCH, lease=ls.id, secret=self.secret, run=run,
                items=pack(sent.chunk.items), budget=sent.chunk.budget, **extra,
            )  # fmt: skip
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - sorted out by the map's thread
            self.events.put(Broken(sent, exc))
            return
        self.events.put(Answered(sent, answer))

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, client_loop(self.client))

    def poll(self, timeout: float) -> list[Heard]:
        """Events that happened, waiting up to ``timeout`` seconds for the first."""
        if self.unattached:
            self.attach_new()
        try:
            out = [self.events.get(timeout=timeout)]
        except queue.Empty:
            return []
        while True:
            try:
                out.append(self.events.get_nowait())
            except queue.Empty:
                return out

    def close(self, keep: bool = False) -> None:
        """Stop using the leases: idle ones go back to the client's pool (``keep``), the rest end now."""
        if self.closed:
            return
        self.closed = True
        self.pool.active.discard(self)
        ending, keeping = [], []
        for ls in self.leases.values():
            if ls.dead:
                continue
            busy = bool(ls.outstanding)
            for sent in ls.outstanding:
                if sent.handle is not None:
                    sent.handle.cancel()
            ls.outstanding.clear()
            if keep and not busy and ls.pooled and self.pool.linger > 0:
                keeping.append(ls)
            else:
                ending.append(ls)
        if keeping:
            self.pool.give(self.key, keeping)
        end_leases(self.client, self.secret, ending)


def _lease_done(ls: Lease) -> None:
    """A lease task ended: tell the map using it, or drop it from the pool."""
    owner = ls.owner
    if owner is not None:
        owner.events.put(LeaseEnded(ls))
    else:
        ls.dead = True


class DirectDispatcher:
    """The direct path behind :class:`.dispatch.Dispatcher`: a map's :class:`Leases`, fed round by round.

    Made by :meth:`open` when the workers answer this client; otherwise the
    map uses :class:`.tasks.TaskDispatcher`.  It places (and replaces)
    leases every :data:`PLACE_EVERY_SECONDS`, spreads each round of chunks
    over the emptiest leases, and turns what its leases hear
    (:data:`Heard`) into the map's :class:`~.dispatch.MapEvent`\\ s.

    Parameters
    ----------
    client : distributed.Client
    leases : Leases
    check : callable
        Raises the map's "scheduler lost" error when the scheduler is gone
        (called while waiting on the client's loop).
    """

    name = "direct"
    unit = "batch"

    def __init__(self, client: Client, leases: Leases, check: Callable[[], None]):
        self.client = client
        self.leases = leases
        self.check = check
        self._threads = 1
        self._next_place = 0.0
        self._replace = False  # a lease was lost: replace it at once if work is left
        # Tells an adaptive cluster how many more threads the map could use (engine/demand.py).
        self._demand = Demand(client, leases.map_id, leases.resources, leases.limit)
        self._more_work = True

    @classmethod
    def open(
        cls,
        client: Client,
        map_id: str,
        resources: dict | None,
        concurrency: int | None,
        run: MapRun,
        big: dict | None,
        check: Callable[[], None],
    ) -> DirectDispatcher | None:
        """The direct path for a map, or None when this client cannot reach the workers directly."""
        if not direct_reachable(client):
            return None
        self = cls(client, Leases(client, map_id, resources, concurrency, run, big=big), check)
        # Idle leases of this client's previous map start this one at once (no scheduler round trip).
        cap = concurrency if concurrency is not None else cached_threads(client)
        if cap and self.leases.adopt(cap) >= cap:
            self._threads = max(len(self.leases.live()), 1)
            self._next_place = time.monotonic() + PLACE_EVERY_SECONDS
        return self

    # -- the protocol -------------------------------------------------------------------
    def threads(self) -> int:
        return self._threads

    def room(self, in_flight: int) -> int:
        leases = self.leases
        return sum(leases.room(ls) for ls in leases.free())

    def sizing(self, remaining: int | None, round_remaining: int | None, per_item: float | None, idle: bool) -> dict:
        # The remaining work is spread over every batch slot (DEPTH per lease), not one share per
        # lease: a batch sent now may wait behind its lease's running one, and one share per lease
        # measured the last lease finishing 55-100 ms after the others on 1,000 × 1 ms items (a
        # 180-item batch queued behind a running one).  Only when nothing runs yet and one batch per
        # lease holds all that is left (a short map, an evolution-strategies iteration) is it one
        # share per lease: one batch each, not two.  Batches of one round share the work left at
        # the round's start (guided self-scheduling over the leases).
        self._demand.hint = (remaining, per_item)
        threads = self._threads
        spread = DEPTH * threads
        target, floor = planner.batch_seconds(threads)
        if idle and round_remaining is not None and per_item is not None:
            if target / per_item >= math.ceil(round_remaining / max(threads, 1)):
                # No tail to balance: the share is all there is, however small.
                spread, floor = threads, planner.MIN_TASK_SECONDS
        return {"remaining": round_remaining, "spread": spread, "target": target, "floor": floor}

    def prepare(self, more_work: bool) -> list[MapEvent]:
        self._more_work = more_work
        if not more_work:
            self._demand.close()  # nothing left to send: the leases it has will do
        if self._replace:
            self._replace = False
            if more_work:
                self._next_place = 0.0
        if time.monotonic() < self._next_place:
            return []
        return self._place()

    def send(self, chunks: list[Chunk]) -> list[Any]:
        if not chunks:
            return []
        leases = self.leases
        free = leases.free()
        cap = {ls: len(ls.outstanding) + leases.room(ls) for ls in free}
        # Each chunk goes to the emptiest lease: every lease gets running work before any gets a
        # second, queued batch.  The round goes out together (through relays when it reaches many
        # workers).  A heap of (batches pending, position, lease): the emptiest lease, the first one
        # on ties (min() over the free leases for every chunk took 2-3 ms a round at 256 leases).
        heap = [(len(ls.outstanding), k, ls) for k, ls in enumerate(free)]
        heapq.heapify(heap)
        pairs = []
        for chunk in chunks:  # never more chunks than room
            pending, k, lease = heapq.heappop(heap)
            pairs.append((lease, chunk))
            if pending + 1 < cap[lease]:
                heapq.heappush(heap, (pending + 1, k, lease))
        return list(leases.send_many(pairs))

    def poll(self, timeout: float) -> list[MapEvent]:
        out: list[MapEvent] = []
        for heard in self.leases.poll(timeout):
            self._hear(heard, out)
        return out

    def cancel(self, handle: Any) -> None:
        self._forget(handle)
        if handle.handle is not None:
            handle.handle.cancel()

    def close(self, pending: list[Any], keep: bool = False) -> None:
        self._demand.close()
        self.leases.close(keep=keep)

    def forget_function(self) -> None:
        self.leases.run = self.leases.run.without_function()

    def stats(self) -> Counters:
        leases = self.leases
        return Counters(leases.placed, leases.reused, leases.relayed, leases.early_sent)

    # -- placing leases -----------------------------------------------------------------
    def _place(self) -> list[MapEvent]:
        self._next_place = time.monotonic() + PLACE_EVERY_SECONDS
        self.check()
        if not client_running(self.client):
            return []  # reconnecting: the connection check decides when to give up
        workers = self._wait_on_loop(scheduler_workers(self.client))
        if workers is None:
            return []
        if workers and getattr(self.client, "_jc_direct", None) is None and not direct_reachable(self.client):
            return [Fallback()]
        out: list[MapEvent] = []
        for gone in self.leases.place(workers):
            # Its worker left the scheduler's list without a broken connection telling us first (a
            # partition, or an idle lease's worker): no batch is blamed for it.
            self._lost(gone, deaths=False, out=out)
        self._threads = max(self.leases.wanted, 1)
        self._demand.update(len(self.leases.live()), self._more_work)
        return out

    def _wait_on_loop(self, coro: Any) -> Any:
        """Run ``coro`` on the client's loop; wait in slices, checking the scheduler (None if it failed)."""
        pending = on_client_loop(self.client, coro)
        try:
            while True:
                try:
                    return pending.result(timeout=WAIT_SLICE_SECONDS)
                except concurrent.futures.TimeoutError:
                    self.check()
        except Exception:  # noqa: BLE001 - a scheduler that went away is noticed by the connection check
            self.check()
            return None
        finally:
            if not pending.done():
                pending.cancel()

    # -- what the leases heard, as the map's events ---------------------------------------
    def _hear(self, heard: Heard, out: list[MapEvent]) -> None:
        match heard:
            case LeaseReady(lease=lease):
                if not lease.dead:
                    lease.ready = True
            case LeaseUnreached(lease=lease, error=error):
                # Its attach failed.  An early batch (Leases.room) may be running there: a connection
                # that broke, not one never made, counts a death as a broken batch would (else a
                # poison item on fresh leases killed workers uncounted: its own call's break came later).
                broke = isinstance(error, (OSError, asyncio.TimeoutError)) and not isinstance(error, ConnectFailed)
                self._lost(lease, deaths=broke, out=out)
            case LeaseEnded(lease=lease):
                self._ended(lease, out)
            case Answered(sent=sent) | Broken(sent=sent) | RelayLost(sent=sent) if sent not in sent.lease.outstanding:
                pass  # written off already (its lease was lost), or the map stopped
            case RelayLost(sent=sent, error=error):
                self._relay_lost(sent, error, out)
            case Broken(sent=sent, error=error) if isinstance(error, (OSError, asyncio.TimeoutError)):
                # The connection broke: the worker died (or left).  Every batch of the lease goes
                # elsewhere; the oldest was the one running, unless no connection could be made at
                # all (then none of them ran).
                self._lost(sent.lease, deaths=not isinstance(error, ConnectFailed), out=out)
            case Broken(sent=sent, error=error):
                self._forget(sent)
                out.append(Failed(sent, error))
            case Answered(sent=sent, answer=answer):
                self._forget(sent)
                self._answer(sent, answer, out)

    def _answer(self, sent: Sent, data: Any, out: list[MapEvent]) -> None:
        lease = sent.lease
        match Status.of(data):
            case Status.OK:
                lease.ready = True  # an early batch ran: its lease runs (its attach may answer later)
                out.append(Done(sent, ChunkResult._make(unpack(data["result"]))))  # a plain tuple on the wire
            case Status.NEED_FN:  # the worker process dropped the function from its cache: send it again
                lease.tokens.discard(self.leases.token)
                out.append(Retry(sent))
            case Status.WAITING:  # an early batch (Leases.room) its lease did not start for in time
                lease.early = False  # queued behind other work there: it gets batches once it attaches
                lease.tokens.discard(self.leases.token)  # its worker never loaded the function
                out.append(Retry(sent))
            case Status.GONE:  # the lease ended before it ran the batch: send it elsewhere
                self.leases.kill(lease)
                out.append(Retry(sent))
                self._next_place = 0.0
            case _:
                raise ClusterError(f"worker {lease.addr} refused a batch of this map ({data!r}); run the map again.")

    def _forget(self, sent: Sent) -> None:
        if sent in sent.lease.outstanding:
            sent.lease.outstanding.remove(sent)

    def _relay_lost(self, sent: Sent, exc: BaseException, out: list[MapEvent]) -> None:
        """The relay carrying ``sent`` failed; its lease's worker may be fine.

        The batch goes elsewhere.  If the relay may have forwarded it (not a
        failed connection), the lease may be running it unseen, so the lease
        is given up (its task cancelled, its thread freed) rather than sent
        more work behind it; every result is still taken once, since a late
        answer finds the batch no longer in flight.
        """
        if isinstance(exc, ConnectFailed):
            self._forget(sent)
            out.append(Retry(sent))
        else:
            self._lost(sent.lease, deaths=False, out=out)

    def _ended(self, lease: Lease, out: list[MapEvent]) -> None:
        """The lease task ended without us ending it: a lost worker, or a failure of the lease itself."""
        if lease.dead and not lease.outstanding:
            return
        failed = lease.failed()
        if failed:
            exc = future_error(lease.future)
            if not is_killed_worker(exc):
                raise ClusterError(
                    f"a lease task of this map failed on worker {lease.addr}: {type(exc).__name__}: {exc}; check that jupyter_cluster is installed on the workers."
                )
        self._lost(lease, deaths=failed, out=out)

    def _lost(self, lease: Lease, deaths: bool, out: list[MapEvent]) -> None:
        """A lease's worker is gone: its batches go elsewhere, the one it was running counted as a death."""
        self.leases.kill(lease)
        outstanding, lease.outstanding = list(lease.outstanding), []
        for k, sent in enumerate(outstanding):
            if sent.handle is not None:
                sent.handle.cancel()
            out.append(Died(sent) if k == 0 and deaths else Retry(sent))
        # Replace the lease at once, unless the map is at its tail with nothing left to send (a lease
        # that yielded its thread to another task): a new lease would only queue behind that task.
        # The map's next prepare() says whether work is left, once these batches went back to it.
        self._replace = True
