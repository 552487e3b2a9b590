"""One map's leases and the batches in flight to them (the direct path's client half, :mod:`.direct`).

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
"""

from __future__ import annotations

import asyncio
import itertools
import queue
from dataclasses import dataclass
from typing import Any

from .. import config
from .cluster import ConnectFailed, call, client_loop, worker_slots
from .dispatch import MapSpec
from .lease_pool import Lease, end_leases, pool_for
from .protocol import MapRun, Op, RelayEntry, Status, pack, pack_group, unpack_answers
from .worker import lease
from .worker.registry import ATTACH_WAIT_SECONDS, EARLY_WAIT_SECONDS

#: Batches sent to one lease and not yet answered: one running, one queued.
DEPTH = 2
#: Batches of this many workers travel in one relay message (the probe's group size, ../shared/engine-probe).
RELAY_GROUP = 32
#: A round of batches reaching at least this many workers goes through relays (config ``engine.relay-min-workers``).
RELAY_MIN_WORKERS = 64

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


class Sent:
    """One batch sent to one lease (a chunk sent again is a new ``Sent``)."""

    __slots__ = ("chunk", "lease", "handle")

    def __init__(self, chunk: Any, lease: Lease):
        self.chunk = chunk
        self.lease = lease
        self.handle = None  # concurrent.futures.Future of the RPC coroutine


class Leases:
    """The leases of one map and the batches in flight to them.

    Parameters
    ----------
    spec : MapSpec
        The map: its client, its id (which names the lease tasks,
        ``jc-lease-<map_id>-<n>``), the Dask resources each lease (thread)
        needs, its concurrency (most leases at once, ``Pool(processes=N)``;
        None: every thread that fits) and its :class:`.protocol.MapRun`,
        sent whole with each batch (see :func:`.worker.handlers._batch`).
        Its large values, scattered (``spec.shared.futures``): a map with some places
        its own leases, which Dask hands the values, and ends them after.
    """

    def __init__(self, spec: MapSpec):
        client = self.client = spec.client
        self.map_id = spec.map_id
        resources = self.resources = spec.resources
        self.key = tuple(sorted((resources or {}).items()))
        self.limit = spec.concurrency
        self.run: MapRun = spec.run
        self.token = spec.run.token
        self.big: dict | None = spec.shared.futures
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
