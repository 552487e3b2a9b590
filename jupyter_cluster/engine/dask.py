"""The direct path's client half: leases placed through Dask, batches sent to them over Dask's comm.

:class:`Leases` places one lease task (:func:`.worker.lease`) per worker
thread a map may use, pinned to the worker the client chose from the
scheduler's list, with the map's resources (so Dask still checks them and
counts the thread as busy).  Pinning tells the client where each lease runs
without another scheduler message, and lets a lease lost with its worker be
replaced on a live worker instead of queuing behind a busy thread.  A new
lease is sent its first batch right away, which its worker keeps until the
lease starts (:meth:`Leases.room`); once it answers ``jc_attach`` it takes
batches at full depth: each batch is one
``client.rpc(address).jc_batch(...)`` call on the client's own connection
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
values) and ends them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import math
import queue
import secrets
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import ClusterError, WorkerLostError
from .worker import ATTACH_WAIT_SECONDS, EARLY_WAIT_SECONDS, EnginePlugin, Items, lease, pack, run_items

logger = logging.getLogger(__name__)

#: Batches sent to one lease and not yet answered: one running, one queued.
DEPTH = 2
#: How long the first direct contact with a cluster's worker may take before the map uses plain tasks, in seconds.
REACH_TIMEOUT_SECONDS = 3.0

#: Longest wait for a new connection to a worker, in seconds (Dask's default, 30 s, would stall a
#: batch sent to a worker that has just died; a broken connection is noticed at once anyway).
CONNECT_TIMEOUT_SECONDS = 10.0

#: Batches of this many workers travel in one relay message (the probe's group size, ../shared/engine-probe).
RELAY_GROUP = 32
#: A round of batches reaching at least this many workers goes through relays (config ``engine.relay-min-workers``).
RELAY_MIN_WORKERS = 64
#: How long a client's idle leases wait for its next map when ``engine.linger`` is not configured, in seconds.
LINGER_SECONDS = 60.0

_lease_numbers = itertools.count()


class ConnectFailed(OSError):
    """No connection to a lease's worker could be made: the batch never reached it (no worker death is blamed on it)."""


async def call(client: Any, addr: str, op: str, **msg: Any) -> Any:
    """One request/response with a worker's handler ``op`` over the client's connection pool.

    The pool is the client's own (``client.rpc``, built with its
    ``connection_args``: TLS clusters stay TLS).  Unlike ``client.rpc(addr).op()``
    it gives up connecting after :data:`CONNECT_TIMEOUT_SECONDS` and says so
    with :class:`ConnectFailed`.
    """
    from distributed.core import send_recv

    pool = client.rpc
    try:
        comm = await pool.connect(addr, timeout=CONNECT_TIMEOUT_SECONDS)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - every way of not connecting is the same here
        raise ConnectFailed(f"could not connect to {addr}: {exc}") from exc
    try:
        return await send_recv(comm=comm, op=op, **msg)
    finally:
        pool.reuse(addr, comm)


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

    def __init__(self, client: Any):
        from .. import config

        self.client = client
        self.secret = secrets.token_hex(16)
        configured = config.get("engine.linger")
        self.linger = config.timeout_seconds("engine.linger") if configured is not None else LINGER_SECONDS
        self.lock = threading.Lock()
        self.idle: dict[tuple, list[Lease]] = {}
        self.timer: threading.Timer | None = None

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


def release_leases(client: Any) -> None:
    """End ``client``'s idle leases now (before the client or its cluster closes, so no task is cut off)."""
    pool = getattr(client, "_jc_lease_pool", None)
    if pool is not None:
        pool.reap(everything=True, wait=1.0)


def pool_for(client: Any) -> LeasePool:
    pool = getattr(client, "_jc_lease_pool", None)
    if pool is None:
        pool = client._jc_lease_pool = LeasePool(client)
    return pool


def end_leases(client: Any, secret: str, leases: list[Lease], wait: float = 0.0) -> None:
    """End ``leases`` now: a ``jc_close`` to each (frees the thread at once) and Dask's cancel (frees it for sure).

    ``wait``: seconds to wait for the workers to take the ``jc_close`` (before a cluster closes).
    """
    if not leases:
        return
    loop = client.loop.asyncio_loop
    futures, closing = [], []
    for ls in leases:
        if not ls.dead:
            closing.append(asyncio.run_coroutine_threadsafe(_close(client, ls, secret, wait), loop))
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
            asyncio.run_coroutine_threadsafe(cancelled, loop)


async def _close(client: Any, ls: Lease, secret: str, wait: float = 0.0) -> None:
    try:
        await call(client, ls.addr, "jc_close", lease=ls.id, secret=secret, wait=wait, reply=wait > 0)
    except Exception:  # noqa: BLE001 - Dask's cancellation ends the lease anyway
        pass


def workers_now(client: Any) -> dict[str, dict]:
    """Every worker the scheduler knows now (address -> its info), asked of the scheduler itself.

    Not ``client.scheduler_info(n_workers=-1)["workers"]``: that returns the client's
    shared cache, which the client's own periodic refresh (every 2 s, with
    ``n_workers=0``) can replace between the fetch and the read with one that lists
    no workers, so every worker looked dead (seen under load with ``%%spmd``'s 4 ranks).
    """
    return dict(client.sync(scheduler_workers, client) or {})


def worker_slots(info: dict, resources: dict | None) -> int:
    """How many leases a worker (one entry of ``scheduler_info()["workers"]``) can run at once."""
    n = int(info.get("nthreads", 1) or 1)
    if resources:
        have = info.get("resources") or {}
        for name, need in resources.items():
            n = min(n, int(math.floor(have.get(name, 0) / need + 1e-9)))
    return max(n, 0)


def direct_reachable(client: Any) -> bool:
    """Whether this client can talk to the cluster's workers directly (asked once per client).

    Registers :class:`.worker.EnginePlugin` (the comm handlers) on the
    cluster, then pings one worker.  A client that cannot reach the workers
    (a notebook outside the network that only reaches the scheduler) gets
    ``False`` and a one-line notice; its maps use plain Dask tasks.
    """
    verdict = getattr(client, "_jc_direct", None)
    if verdict is not None:
        return verdict
    with _reach_lock:  # the background check at cluster start and a first map ask once between them
        verdict = getattr(client, "_jc_direct", None)
        if verdict is not None:
            return verdict
        return _direct_reachable(client)


_reach_lock = threading.Lock()


def _direct_reachable(client: Any) -> bool:
    workers = list(workers_now(client))
    if not workers:
        return True  # not known yet; asked again once there are workers
    reason = None
    try:
        client.register_plugin(EnginePlugin(), name=EnginePlugin.name)
    except Exception as exc:  # noqa: BLE001 - any failure means "use the task path"
        reason = f"the workers could not load the engine's handlers ({type(exc).__name__}: {exc})"
    if reason is None:
        # A worker that answers late is asked again, for longer, before the client gives up on the
        # direct path for good (seen: 1,024 simulated workers on 2 cores missed the first 3 s and
        # every map of the run went through the scheduler).
        for wait in (REACH_TIMEOUT_SECONDS, 3 * REACH_TIMEOUT_SECONDS):
            try:
                client.sync(_ping, client, workers[0], wait)
            except Exception as exc:  # noqa: BLE001
                reason = f"worker {workers[0]} did not answer a direct connection ({type(exc).__name__})"
                if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
                    continue
            else:
                reason = None
            break
    if reason is None:
        try:  # how many worker deaths Dask forgives a task, as this scheduler was started (asked once, not mid-map)
            client._jc_allowed_failures = int(client.run_on_scheduler(_allowed_failures))
        except Exception:  # noqa: BLE001 - a scheduler without this package: the local setting stands
            pass
    client._jc_direct = reason is None
    if reason is not None:
        print(
            f"jupyter_cluster: {reason}, so maps go through the Dask scheduler here (slower for short items).",
            file=sys.stderr,
        )
    return client._jc_direct


#: At start-up, direct connections opened to each worker per worker thread (:func:`warm_engine`):
#: a fresh map has its attach, its early batch and then its next batch in flight to each lease at once.
WARM_COMMS_PER_THREAD = 3
#: :func:`warm_engine` opens direct connections to at most this many workers (a client of a larger
#: cluster sends most batches through relays, and a thousand TLS handshakes would load the client).
WARM_WORKERS = 64
#: Connections to the scheduler a new cluster's client keeps open for its first map (:func:`warm_engine`): the
#: map's "job started" event, its look at the workers and the client's own periodic update may overlap.
WARM_SCHEDULER_COMMS = 3


def warm_engine(client: Any, expected: int | None = None, timeout: float = 10.0) -> None:
    """Ready a new cluster for its first map, ahead of it (a background thread at cluster start).

    The direct-path check (:func:`direct_reachable`), then per worker: one
    no-op task pinned to it (:func:`.worker.warm_up`: imports what a first
    batch needs; the scheduler's and the worker's task path run once, so a
    first lease does not pay their first-time costs) and the direct
    connections a first map uses (:data:`WARM_COMMS_PER_THREAD` per thread:
    opened now, the TLS handshakes do not run on the client's event loop in
    the middle of the first map's sends; the same for a few connections to
    the scheduler, since a map's "job started" event holds one while the map
    asks the scheduler for its workers; the client's connection pool keeps
    idle connections open until it reaches its limit, 512 by default).  Each
    task ends at once and holds no thread afterwards.  ``expected``: the
    workers the cluster was started with, waited for (at most ``timeout``
    seconds), so that the last to come up is warmed too; no task is sent
    once a map has started meanwhile (its own leases warm the workers; a
    no-op task arriving after a lease would only take the lease's thread).
    """
    from .worker import warm_up

    if not direct_reachable(client):
        return
    if expected:
        try:
            client.wait_for_workers(expected, timeout=timeout)
        except Exception:  # noqa: BLE001 - warm the workers there are (a slow start, a worker that died)
            pass
    workers = workers_now(client)
    addrs = sorted(workers)[:WARM_WORKERS]
    futures = []
    # Not once a map has begun (its Leases made the client's pool): its leases warm the workers, and a
    # no-op task reaching a worker after an idle lease took that lease's thread, so the map placed
    # another (4 leases for 2 one-thread workers, a map run right after the start).  Submitted before a
    # map's leases, the tasks run first and cost the map nothing.
    if getattr(client, "_jc_lease_pool", None) is None:
        futures = [
            client.submit(
                warm_up, key=f"jc-warm-{secrets.token_hex(6)}", workers=[a], allow_other_workers=False, pure=False
            )
            for a in addrs
        ]
    try:
        pings = [(a, WARM_COMMS_PER_THREAD * int(workers[a].get("nthreads", 1) or 1)) for a in addrs]
        client.sync(_open_comms, client, pings, timeout)
        deadline = time.monotonic() + timeout
        for fut in futures:  # not distributed.wait: it needs a default client, and ours is not one
            fut.result(timeout=max(deadline - time.monotonic(), 0.1))
        client._jc_warmed = addrs  # what was warmed (tests, diagnostics)
    finally:
        client.cancel([f for f in futures if not f.done()])
        del futures


async def _open_comms(client: Any, pings: list[tuple[str, int]], timeout: float) -> None:
    """``n`` concurrent pings to each ``(address, n)``, and :data:`WARM_SCHEDULER_COMMS` to the scheduler.

    Concurrent calls each take their own connection from the client's pool,
    which keeps them open afterwards for the next calls.
    """
    calls = [call(client, a, "jc_ping") for a, n in pings for _ in range(n)]
    calls += [client.scheduler.identity(n_workers=0) for _ in range(WARM_SCHEDULER_COMMS)]
    await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), timeout)


def _allowed_failures(dask_scheduler=None) -> int:
    return dask_scheduler.allowed_failures


async def _ping(client: Any, addr: str, wait: float = REACH_TIMEOUT_SECONDS) -> Any:
    return await asyncio.wait_for(call(client, addr, "jc_ping"), wait)


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
    run : tuple
        ``(token, blob, star, options)``: the map's function (see :func:`.worker._batch`).
    big : dict or None
        The map's large values (scattered futures); a map with some places
        its own leases, which Dask hands the values, and ends them after.
    """

    def __init__(
        self, client: Any, map_id: str, resources: dict | None, limit: int | None, run: tuple, big: dict | None = None
    ):
        self.client = client
        self.map_id = map_id
        self.resources = resources
        self.key = tuple(sorted((resources or {}).items()))
        self.limit = limit
        self.token, self.blob, self.star, self.options = run
        self.big = big
        self.pool = pool_for(client)
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
        from .. import config

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
                self.events.put(("lease-done", ls, None))
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
                    self.client, ls.addr, "jc_attach", lease=ls.id, secret=self.secret, wait=ATTACH_WAIT_SECONDS
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the worker is gone or unreachable
                owner = ls.owner
                if owner is not None:
                    owner.events.put(("lost", ls, exc))
                else:
                    ls.dead = True
                return
            status = answer.get("status") if isinstance(answer, dict) else None
            if status == "ready":
                ls.ready = True
                owner = ls.owner
                if owner is not None:
                    owner.events.put(("ready", ls, None))
                return
            if status != "waiting":
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

    def _run_for(self, ls: Lease) -> tuple:
        """The map's ``run`` tuple for a batch to ``ls``: with the function the first time its worker process gets it."""
        if self.token in ls.tokens:
            blob = None
        else:
            blob = self.blob
            ls.tokens.add(self.token)
        return (self.token, blob, self.star, self.options)

    def send_many(self, pairs: list[tuple[Lease, Any]]) -> list[Sent]:
        """Send one round of batches (``(lease, chunk)`` pairs); returns their :class:`Sent`, in order.

        A round that reaches at least ``relay_min`` workers goes through
        relays: the workers are taken in groups of :data:`RELAY_GROUP`, and
        the client sends each group's batches in one ``jc_relay`` message to
        the group's first worker, which forwards them over its own
        connections and answers with all of them (:func:`.worker._relay`).
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
                self.events.put(("error", sent, exc))
                continue
            groups.setdefault(group_of[ls.addr], []).append(sent)
        for k, sents in groups.items():
            # The lease's token set is the map thread's: the run tuples are built here too.
            entries = [
                (ls.addr, ls.id, self.secret, self._run_for(ls), payloads[id(sent)], sent.chunk.budget)
                for sent in sents
                for ls in (sent.lease,)
            ]
            handle = self._run(self._send_group(addrs[k * RELAY_GROUP], sents, entries))
            for sent in sents:
                sent.handle = handle
        self.relayed += len(groups)
        return out

    async def _send_group(self, relay: str, sents: list[Sent], entries: list[tuple]) -> None:
        try:
            from .worker import pack_group, unpack_answers

            answer = await call(self.client, relay, "jc_relay", entries=pack_group(entries))
            answers = unpack_answers(answer["answers"])
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - sorted out by the map's thread
            for sent in sents:
                # A batch of the relay's own worker is lost like a direct one; the others may be
                # running on live members: the map's thread sends them elsewhere.
                self.events.put(("error" if sent.lease.addr == relay else "relay-lost", sent, exc))
            return
        for sent, ans in zip(sents, answers):
            if isinstance(ans, dict) and ans.get("status") == "unreachable":
                cls = OSError if ans.get("connected") else ConnectFailed
                self.events.put(
                    ("error", sent, cls(f"relay {relay} could not reach {sent.lease.addr}: {ans.get('error')}"))
                )
            else:
                self.events.put(("answer", sent, ans))

    async def _send(self, sent: Sent, run: tuple, wait: float | None = None) -> None:
        ls = sent.lease
        extra = {} if wait is None else {"wait": wait}
        try:
            answer = await call(
                self.client, ls.addr, "jc_batch", lease=ls.id, secret=self.secret, run=run,
                items=pack(sent.chunk.items), budget=sent.chunk.budget, **extra,
            )  # fmt: skip
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - sorted out by the map's thread
            self.events.put(("error", sent, exc))
            return
        self.events.put(("answer", sent, answer))

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.client.loop.asyncio_loop)

    def poll(self, timeout: float) -> list[tuple]:
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
        owner.events.put(("lease-done", ls, None))
    else:
        ls.dead = True


# -- the client and its scheduler ---------------------------------------------------------
def client_of(client: Any) -> tuple[Any, Any]:
    """``(distributed.Client, cluster name or scheduler address)`` from a Client or a ClusterHandle."""
    if client is None:
        raise TypeError(
            "a map needs a client or a cluster handle; jupyter_cluster.map() finds the current cluster for you."
        )
    if hasattr(client, "client") and hasattr(client, "address"):  # ClusterHandle
        return client.client, client.name
    return client, getattr(client, "scheduler", None) and scheduler_address(client)


def scheduler_address(client: Any) -> str:
    """The address ``client`` talks to its scheduler at, ``"?"`` when it has none (a client being built or torn down)."""
    return str(getattr(getattr(client, "scheduler", None), "address", "?"))


def allowed_failures(client: Any) -> int:
    """How many worker deaths Dask forgives a task on ``client``'s cluster (``allowed-failures``).

    The scheduler's own value when :func:`direct_reachable` could ask it (a
    scheduler process started with its own setting), else this process's
    ``distributed.scheduler.allowed-failures``.  No round trip: a map asks
    this when a worker dies, and must not wait on the scheduler then.
    """
    known = getattr(client, "_jc_allowed_failures", None)
    if known is None:
        import dask.config

        known = dask.config.get("distributed.scheduler.allowed-failures", 3)
    return int(known)


def cached_threads(client: Any) -> int | None:
    """Worker threads as of the client's own periodic scheduler update (no round trip)."""
    ident = getattr(client, "_scheduler_identity", None) or {}
    n = ident.get("total_threads")
    return int(n) if n is not None else None


def total_threads(client: Any) -> int:
    n = cached_threads(client)
    if n is None:  # before the client's first update only
        try:
            n = sum(client.nthreads().values())
        except Exception:
            n = 0
    return max(int(n or 0), 1)


async def scheduler_workers(client: Any) -> dict:
    """Every worker's entry of the scheduler's identity (runs on the client's loop)."""
    info = await client.scheduler.identity(n_workers=-1)
    return info.get("workers", {})


async def gather_skipping_errors(client: Any, futures: dict) -> dict:
    # Runs on the client's event loop (see MapJob._fetch).
    return await client.gather(futures, errors="skip", asynchronous=True)


def item_bytes(item: Any) -> int:
    """Size of one item in bytes (an estimate for the whole input), 1 KB when it cannot be told.

    Dask's ``sizeof`` knows arrays and frames without copying them; pickling
    the item to measure it would cost as much as sending it.
    """
    from dask.sizeof import sizeof

    try:
        return int(sizeof(item))
    except Exception:
        return 1024


# -- the task path: one Dask task per chunk ---------------------------------------------------
class TaskSubmitter:
    """The task path's Dask side: chunks as tasks, a completion tracker, one gather per drained batch.

    Used when the workers cannot be reached directly (the fallback) and for
    ``--all-workers`` cells (one task pinned to each worker).
    """

    def __init__(self, client: Any):
        from distributed import as_completed

        self.client = client
        # Completion only: results are fetched per drained batch (one gather for many chunks).
        self.ac = as_completed(with_results=False, loop=client.loop)

    def submit(self, chunks: list[tuple], keys: list[str], run: tuple, resources: dict | None) -> list:
        """Futures for ``chunks`` (``(items, budget, pin, suspect)`` each), keyed ``keys``.

        ``run`` is ``(token, blob, big, star, options)`` of :func:`.worker.run_items`.
        Pinned and suspect chunks go one by one; the others in one
        ``client.map`` (one graph update instead of one per chunk).
        """
        token, blob, big, star, options = run
        out: list = [None] * len(chunks)
        plain = []
        for k, (items, budget, pin, suspect) in enumerate(chunks):
            if pin is None and not suspect:
                plain.append(k)
                continue
            kwargs: dict[str, Any] = {"pure": False, "key": keys[k]}
            if resources:
                kwargs["resources"] = resources
            if pin is not None:
                kwargs["workers"] = [pin]
                kwargs["allow_other_workers"] = False
            out[k] = self.client.submit(run_items, Items(items, budget), token, blob, big, star, options, **kwargs)
        if plain:
            kwargs = {"resources": resources} if resources else {}
            futures = self.client.map(
                run_items,
                [Items(chunks[k][0], chunks[k][1]) for k in plain],
                key=[keys[k] for k in plain],
                pure=False,
                token=token,
                blob=blob,
                big=big,
                star=star,
                options=options,
                **kwargs,
            )
            for k, fut in zip(plain, futures):
                out[k] = fut
        self.ac.update(out)
        return out

    def track(self, fut: Any) -> None:
        """Report ``fut`` again when it completes (Dask is re-running it)."""
        self.ac.add(fut)

    def wait(self, tick: Any) -> list:
        """Futures that completed; ``tick()`` runs every 0.2 s meanwhile and may return futures to report instead."""
        ac = self.ac
        cond = ac.thread_condition
        while True:
            with cond:
                if ac.queue.empty():
                    cond.wait(0.2)
                if not ac.queue.empty():
                    break
            # The checks run with the condition released: some ask the
            # scheduler synchronously (scheduler_info for pinned workers),
            # which needs the client's event loop, and as_completed's
            # callbacks on that loop take this same condition -- holding it
            # here deadlocked maps.
            stale = tick()
            if stale:
                return stale
        batch = []
        while not ac.queue.empty():
            batch.append(ac.queue.get_nowait())
        return batch

    def gather(self, futures: list, slice_s: float, check: Any) -> dict:
        """Key -> result of the finished ``futures`` (errors skipped), waiting in slices with ``check()`` between."""
        pending = asyncio.run_coroutine_threadsafe(
            gather_skipping_errors(self.client, {f.key: f for f in futures}), self.client.loop.asyncio_loop
        )
        try:
            while True:
                try:
                    return pending.result(timeout=slice_s)
                except concurrent.futures.TimeoutError:
                    check()
        finally:
            if not pending.done():
                pending.cancel()


def scatter_shared(client: Any, values: dict) -> dict:
    """Send large values to every worker once; name -> future."""
    names = list(values)
    try:
        futures = client.scatter([values[n] for n in names], broadcast=True, hash=False)
    except Exception as exc:
        raise ClusterError(f"sending the large values {', '.join(names)} to the workers failed: {exc}.") from exc
    return dict(zip(names, futures))


def on_client_loop(client: Any, coro: Any) -> concurrent.futures.Future:
    """Run ``coro`` on ``client``'s event loop; a future this thread may wait on."""
    return asyncio.run_coroutine_threadsafe(coro, client.loop.asyncio_loop)


def task_state(fut: Any) -> str:
    """A task's state as its client knows it: "pending", "finished", "error", "cancelled" or "lost"."""
    return fut.status


def task_key(fut: Any) -> str:
    """A task's key (what names it in the scheduler and in a gather's answer)."""
    return fut.key


def cancel_task(fut: Any) -> None:
    """Cancel one task (the scheduler forgets it; a worker running it stops between items)."""
    fut.cancel()


def client_running(client: Any) -> bool:
    """Whether ``client`` is connected to its scheduler now (not reconnecting, closing or closed)."""
    return getattr(client, "status", "running") == "running"


def all_finished(futures: Any) -> bool:
    return all(f.status == "finished" for f in futures)


def release_futures(futures: Any) -> None:
    for f in futures:
        try:
            f.release()
        except Exception:  # noqa: BLE001 - the client may be closing
            pass


def cancel_futures(client: Any, futures: list, reason: str) -> None:
    """Cancel ``futures`` if the client is still connected (workers stop between items; the map and ``Pool.terminate``)."""
    if getattr(client, "status", None) != "running":
        return
    try:
        client.cancel(futures, reason=reason)
    except TypeError:  # older distributed without reason=
        client.cancel(futures)
    except Exception:  # noqa: BLE001
        logger.debug("cancelling futures failed", exc_info=True)


def future_error(fut: Any) -> BaseException:
    """The exception a failed future holds (or the reason it could not be fetched)."""
    try:
        return fut.exception(timeout=10)
    except Exception as err:  # noqa: BLE001
        return err


def is_killed_worker(exc: BaseException) -> bool:
    """Whether Dask gave up on a task because the workers running it kept dying."""
    from distributed.scheduler import KilledWorker

    return isinstance(exc, KilledWorker)


# -- single calls: Pool.apply_async's tasks ----------------------------------------------------
def submit_call(client: Any, fn: Callable, *args: Any, key: str, on_done: Callable[[Any], None]) -> Any:
    """Run ``fn(*args)`` as one Dask task named ``key``; ``on_done(future)`` runs once it has ended.

    Parameters
    ----------
    client : distributed.Client
    fn : callable
        Sent by value; ``args`` are passed positionally only, so that no
        argument of the caller can be taken for one of ``Client.submit``'s
        own keywords (``key``, ``workers``, ...).
    key : str
        The task's key: unique (``pure=False``: the same call made twice runs twice).
    on_done : callable
        Called with the future from Dask's callback thread, whatever the
        outcome (finished, failed, cancelled).  It may run before this function
        returns, so a caller that records the future first holds a lock that
        ``on_done`` takes too.

    Returns
    -------
    distributed.Future
        Raises whatever ``Client.submit`` raises (an argument that cannot be pickled).
    """
    future = client.submit(fn, *args, key=key, pure=False)
    future.add_done_callback(on_done)
    return future


def finished_values(client: Any, futures: list) -> Iterator[tuple[bool, Any]]:
    """The outcome of each ended future, in order: ``(True, value)`` or ``(False, exception)``.

    The values of all the finished ones come in one gather: one
    ``Future.result()`` per task would cost a round trip each, which dominates
    when many small calls end together.  If that gather fails (one of them
    failed after all) they are fetched one by one.  Each future is released
    once the caller has taken its outcome and asked for the next (so the
    cluster may forget its result); the exceptions are Dask's own (see
    :func:`translate_error`).
    """
    finished = [f for f in futures if f.status == "finished"]
    values: dict[str, Any] = {}
    if len(finished) > 1:
        try:
            values = dict(zip((f.key for f in finished), client.gather(finished)))
        except BaseException:  # noqa: BLE001 - one of them failed after all: fetched one by one below
            values = {}
    for future in futures:
        try:
            outcome = (True, values[future.key] if future.key in values else future.result())
        except BaseException as exc:  # noqa: BLE001 - the call's own error, or Dask's; the caller translates it
            outcome = (False, exc)
        try:
            yield outcome
        finally:
            future.release()


# -- every worker ---------------------------------------------------------------------------
def run_on_every_worker(client: Any, fn: Callable, *args: Any) -> dict[str, Any]:
    """``fn(*args)`` on the event loop of every worker connected now; worker address -> result.

    For short bookkeeping of the package itself (``Pool`` releasing its
    globals), not for user code: it needs no free worker thread (workers busy
    with other tasks answer at once), shows no job in progress bars or the
    panel, and a worker where ``fn`` fails is left out of the answer.  User
    code runs on every worker through
    :func:`jupyter_cluster.mapping.all_workers_job` instead: on the event loop
    it would stop the worker's heartbeats while it runs, with no output
    capture, timeout, progress or interrupt.  Nothing runs when the client is
    not connected (``{}``); otherwise raises what ``Client.run`` raises.
    """
    if not client_running(client):
        return {}
    return client.run(fn, *args, on_error="ignore")


# -- telling a scheduler that went away from one that blinked -----------------------------
# Dask's futures stay pending while a client tries to reconnect, which looks
# like a hang to the user.  The map engine and ``Pool`` both ask a
# SchedulerWatch whether to give up.

#: How long the client may be disconnected from the scheduler before work fails, in seconds.
DISCONNECT_GRACE_SECONDS = 2.0


class SchedulerWatch:
    """Follows one client's connection to its scheduler.

    Parameters
    ----------
    client : distributed.Client
    grace : float
        Seconds a reconnecting client is given before :meth:`lost` says so.
    """

    def __init__(self, client: Any, grace: float = DISCONNECT_GRACE_SECONDS):
        self.client = client
        self.grace = grace
        self._since: float | None = None

    def reset(self) -> None:
        """Forget an earlier disconnection (nothing is waiting on the scheduler)."""
        self._since = None

    def lost(self) -> bool:
        """Whether the scheduler is gone for good: closed, or away longer than the grace period."""
        status = getattr(self.client, "status", "running")
        if status == "running":
            self._since = None
            return False
        now = time.monotonic()
        if self._since is None:
            self._since = now
        return status in ("closed", "closing") or now - self._since > self.grace


def scheduler_lost_error(client: Any, lost: str, redo: str, cluster: str | None = None) -> ClusterError:
    """The error for work whose scheduler stopped answering (once :meth:`SchedulerWatch.lost` says so).

    One wording for the map and ``Pool``.  ``lost`` says what became of the
    work (``"this call's result is lost"``), ``redo`` what to make anew once
    a cluster is back (``"a new Pool"``); ``cluster`` names the cluster when
    it has a name (a map given a plain client knows only the address).
    """
    address = scheduler_address(client)
    where = f"at {address}" if cluster is None or cluster == address else f"of cluster {cluster!r} ({address})"
    return ClusterError(
        f"the scheduler {where} stopped answering: {lost}; start or connect a cluster "
        f"(%cluster start / %cluster connect) and {redo}."
    )


def translate_error(exc: BaseException, what: str, cluster: str) -> BaseException:
    """Dask's ways of saying "the cluster failed" in our words; a task's own error passes unchanged.

    ``what`` names the call (``"apply_async(f)"``), ``cluster`` the cluster.
    """
    from distributed.client import FutureCancelledError

    if is_killed_worker(exc):
        lost = WorkerLostError(
            f"{what} killed the worker process running it every time it was tried, so it was given up; "
            "look for what in the call crashes the process (memory, a native library, os._exit)."
        )
        lost.__cause__ = exc
        return lost
    if isinstance(exc, (FutureCancelledError, OSError)) and not isinstance(exc, TimeoutError):
        gone = ClusterError(
            f"{what} was lost because the connection to cluster {cluster!r} "
            "broke (was the cluster stopped?); start or connect a cluster and a new Pool."
        )
        gone.__cause__ = exc
        return gone
    return exc
