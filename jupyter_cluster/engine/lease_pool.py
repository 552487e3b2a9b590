"""A client's idle leases, kept for its next map: :class:`LeasePool`, and ending leases.

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
import logging
import secrets
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from distributed import Client

from .. import config
from .cluster import call, client_loop
from .protocol import Op

if TYPE_CHECKING:
    from .leases import Leases

logger = logging.getLogger("jupyter_cluster.engine.direct")

#: How long a client's idle leases wait for its next map when ``engine.linger`` is not configured, in seconds.
LINGER_SECONDS = 60.0


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
