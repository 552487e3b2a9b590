"""The direct path: leases placed through Dask, batches sent to them over Dask's comm.

:class:`DirectDispatcher` is the path behind :class:`.dispatch.Dispatcher`;
a map's leases and the batches in flight to them are :class:`.leases.Leases`
(placing, attaching, sending, relays), and a client's idle leases, kept for
its next map, its :class:`.lease_pool.LeasePool`.  The why of each is in
those modules and in ``docs/engine.md``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import heapq
import math
import time
from collections.abc import Callable
from typing import Any

from distributed import Client

from ..errors import ClusterError
from . import planner
from .cluster import (
    ConnectFailed,
    cached_threads,
    client_running,
    direct_reachable,
    future_error,
    is_killed_worker,
    on_client_loop,
    scheduler_workers,
)
from .demand import Demand
from .dispatch import Chunk, Counters, Died, Done, Failed, Fallback, MapEvent, MapSpec, Retry
from .lease_pool import LINGER_SECONDS, Lease, LeasePool, end_leases, pool_for, release_leases  # noqa: F401
from .leases import (  # noqa: F401  (DEPTH, RELAY_*, EARLY_WAIT_SECONDS: read here by tests and tools)
    DEPTH,
    EARLY_WAIT_SECONDS,
    RELAY_GROUP,
    RELAY_MIN_WORKERS,
    Answered,
    Broken,
    Heard,
    LeaseEnded,
    LeaseReady,
    Leases,
    LeaseUnreached,
    RelayLost,
    Sent,
)
from .protocol import ChunkResult, Status, unpack

#: A map looks at the scheduler's workers (to place and replace leases) this often, in seconds.
PLACE_EVERY_SECONDS = 2.0
#: While waiting on the client's loop, look at the scheduler this often, in seconds.
WAIT_SLICE_SECONDS = 1.0


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
    holds_threads = True

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
    def open(cls, spec: MapSpec) -> DirectDispatcher | None:
        """The direct path for a map, or None when this client cannot reach the workers directly."""
        client, concurrency = spec.client, spec.concurrency
        if not direct_reachable(client):
            return None
        self = cls(client, Leases(spec), spec.check)
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
