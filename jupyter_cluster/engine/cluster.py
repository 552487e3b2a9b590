"""The client, its scheduler and its workers: everything the engine asks of a cluster, and nothing of a map.

Worker lists and thread counts (from the client's own cache where a round
trip would cost), the direct path's reachability check and one request to a
worker's handler (:func:`call`), the warm-up of a new cluster, and Dask's
futures behind small named helpers; telling a slow scheduler from a lost one
is :mod:`.scheduler_watch`'s.  The map (:mod:`.job`) and the two dispatchers
(:mod:`.direct`, :mod:`.tasks`) use these instead of Dask's API directly.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import secrets
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from distributed import Client, Scheduler
from distributed.comm import CommClosedError
from distributed.core import send_recv

from ..errors import ClusterError
from .protocol import Op
from .worker import EnginePlugin, warm_up

logger = logging.getLogger(__name__)

#: How long the first direct contact with a cluster's worker may take before the map uses plain tasks, in seconds.
REACH_TIMEOUT_SECONDS = 3.0

#: Longest wait for a new connection to a worker, in seconds (Dask's default, 30 s, would stall a
#: batch sent to a worker that has just died; a broken connection is noticed at once anyway).
CONNECT_TIMEOUT_SECONDS = 10.0


class ConnectFailed(OSError):
    """No connection to a lease's worker could be made: the batch never reached it (no worker death is blamed on it)."""


async def call(client: Client, addr: str, op: str, **msg: Any) -> Any:
    """One request/response with a worker's handler ``op`` over the client's connection pool.

    The pool is the client's own (``client.rpc``, built with its
    ``connection_args``: TLS clusters stay TLS).  Unlike ``client.rpc(addr).op()``
    it gives up connecting after :data:`CONNECT_TIMEOUT_SECONDS` and says so
    with :class:`ConnectFailed`.
    """
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


def workers_now(client: Client) -> dict[str, dict]:
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


def direct_reachable(client: Client) -> bool:
    """Whether this client can talk to the cluster's workers directly (the verdict is kept on the client).

    A local cluster (workers started with the handlers, scheduler in this
    process) is reachable without asking anything.  Any other cluster gets
    :class:`.worker.EnginePlugin` (the comm handlers) registered, unless its
    workers start with it, and then one worker is pinged.  A client that
    cannot reach the workers (a notebook outside the network that only
    reaches the scheduler) gets ``False`` and a one-line notice; its maps use
    plain Dask tasks.  A comm that closes during the registration (a restart
    under way) gives ``False`` for this map only: the verdict is not kept,
    and the next map asks again.
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


#: Set (True) on a cluster object whose every worker process gets :class:`.worker.EnginePlugin` as it
#: starts, before it registers with the scheduler (a local cluster: ``backends.local``).
ENGINE_AT_SPAWN = "_jc_engine_at_spawn"


def engine_at_spawn(client: Client) -> bool:
    """Whether every worker of ``client``'s cluster has the engine's handlers from its start (no registration needed)."""
    return bool(getattr(getattr(client, "cluster", None), ENGINE_AT_SPAWN, False))


def _in_process_scheduler(client: Client) -> Any:
    """The ``distributed.Scheduler`` itself when it runs in this process (a local cluster), else None."""
    scheduler = getattr(getattr(client, "cluster", None), "scheduler", None)
    return scheduler if isinstance(scheduler, Scheduler) else None


def _direct_reachable(client: Client) -> bool:
    if engine_at_spawn(client) and (scheduler := _in_process_scheduler(client)) is not None:
        # A local cluster: its workers are this machine's processes, started with the handlers, and
        # its scheduler is in this process.  Nothing to ask (three round trips of a first map).
        _keep_allowed_failures(client, scheduler)
        setattr(client, "_jc_direct", True)  # noqa: B010 - the client's own verdict, as below
        return True
    workers = list(workers_now(client))
    if not workers:
        return True  # not known yet; asked again once there are workers
    reason = None
    if not engine_at_spawn(client):
        # A broadcast to every worker through the scheduler, waiting for each one's answer: 0.1-0.3 s
        # of a first map on a fresh cluster, which a local cluster's workers skip (they start with it).
        try:
            client.register_plugin(EnginePlugin(), name=EnginePlugin.name)
        except CommClosedError as exc:
            # A comm closed mid-way (a restart or a reconnect under way): no verdict
            # on the workers.  This map takes the task path; the next one asks again.
            print(
                f"jupyter_cluster: the engine's handlers could not be registered just now ({type(exc).__name__}:"
                f" {exc}), so this map goes through the Dask scheduler; the next one tries again.",
                file=sys.stderr,
            )
            return False
        except Exception as exc:  # noqa: BLE001 - any other failure means "use the task path"
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
        _keep_allowed_failures(client, _in_process_scheduler(client))
    setattr(client, "_jc_direct", reason is None)  # noqa: B010 - the client's own verdict, asked once
    if reason is not None:
        print(
            f"jupyter_cluster: {reason}, so maps go through the Dask scheduler here (slower for short items).",
            file=sys.stderr,
        )
    return reason is None


#: At start-up, direct connections opened to each worker per worker thread (:func:`warm_engine`):
#: a fresh map has its attach, its early batch and then its next batch in flight to each lease at once.
WARM_COMMS_PER_THREAD = 3
#: :func:`warm_engine` opens direct connections to at most this many workers (a client of a larger
#: cluster sends most batches through relays, and a thousand TLS handshakes would load the client).
WARM_WORKERS = 64
#: Connections to the scheduler a new cluster's client keeps open for its first map (:func:`warm_engine`): the
#: map's "job started" event, its look at the workers and the client's own periodic update may overlap.
WARM_SCHEDULER_COMMS = 3


def warm_engine(client: Client, expected: int | None = None, timeout: float = 10.0) -> None:
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
    seconds), so that the last to come up is warmed too; no task is sent,
    and no spare connection opened, once a map has started meanwhile (its
    own leases warm the workers; a no-op task arriving after a lease would
    only take the lease's thread, and the handshakes share the client's
    event loop with the map).
    """
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
    # The connections and the tasks share one deadline: each given the whole timeout, a sick cluster
    # held the warm-up (and a stop() waiting for it) three times as long.
    deadline = time.monotonic() + timeout
    try:
        # One connection per worker first (what a first map's batch uses), then the spares, unless a map
        # has begun meanwhile (Run All): their TLS handshakes would share the client's event loop with it.
        if getattr(client, "_jc_lease_pool", None) is None:
            client.sync(_open_comms, client, [(a, 1) for a in addrs], _left(deadline), 0)
        if getattr(client, "_jc_lease_pool", None) is None:
            pings = [(a, WARM_COMMS_PER_THREAD * int(workers[a].get("nthreads", 1) or 1)) for a in addrs]
            client.sync(_open_comms, client, pings, _left(deadline))
        for fut in futures:  # not distributed.wait: it needs a default client, and ours is not one
            fut.result(timeout=_left(deadline))
        client._jc_warmed = addrs  # type: ignore[attr-defined]  # what was warmed (tests, diagnostics)
    finally:
        client.cancel([f for f in futures if not f.done()])
        del futures


def _left(deadline: float) -> float:
    """Seconds left until ``deadline`` (``time.monotonic()``), at least 0.1 (a last short wait, never none)."""
    return max(deadline - time.monotonic(), 0.1)


async def _open_comms(
    client: Client, pings: list[tuple[str, int]], timeout: float, to_scheduler: int = WARM_SCHEDULER_COMMS
) -> None:
    """``n`` concurrent pings to each ``(address, n)``, and ``to_scheduler`` to the scheduler.

    Concurrent calls each take their own connection from the client's pool,
    which keeps them open afterwards for the next calls.
    """
    calls = [call(client, a, Op.PING) for a, n in pings for _ in range(n)]
    scheduler = client.scheduler
    assert scheduler is not None  # a connected client
    calls += [scheduler.identity(n_workers=0) for _ in range(to_scheduler)]
    await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), timeout)


def _allowed_failures(dask_scheduler=None) -> int:
    return dask_scheduler.allowed_failures


def _keep_allowed_failures(client: Client, scheduler: Scheduler | None) -> None:
    """Keep on ``client`` how many worker deaths its scheduler forgives a task (read by :func:`allowed_failures`).

    Asked once, as the scheduler was started, not mid-map: ``scheduler`` is the
    in-process one (a local cluster), else the scheduler is asked.
    """
    try:
        failures = scheduler.allowed_failures if scheduler is not None else client.run_on_scheduler(_allowed_failures)
        client._jc_allowed_failures = int(failures)  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - a scheduler without this package: the local setting stands
        pass


async def _ping(client: Client, addr: str, wait: float = REACH_TIMEOUT_SECONDS) -> Any:
    return await asyncio.wait_for(call(client, addr, Op.PING), wait)


# -- the client and its scheduler ---------------------------------------------------------
def client_of(client: Any) -> tuple[Client, Any]:
    """``(distributed.Client, cluster name or scheduler address)`` from a Client or a ClusterHandle."""
    if client is None:
        raise TypeError(
            "a map needs a client or a cluster handle; jupyter_cluster.map() finds the current cluster for you."
        )
    if hasattr(client, "client") and hasattr(client, "address"):  # ClusterHandle
        return client.client, client.name
    return client, getattr(client, "scheduler", None) and scheduler_address(client)


def scheduler_address(client: Client) -> str:
    """The address ``client`` talks to its scheduler at, ``"?"`` when it has none (a client being built or torn down)."""
    return str(getattr(getattr(client, "scheduler", None), "address", "?"))


def allowed_failures(client: Client) -> int:
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


def cached_threads(client: Client) -> int | None:
    """Worker threads as of the client's own periodic scheduler update (no round trip)."""
    ident = getattr(client, "_scheduler_identity", None) or {}
    n = ident.get("total_threads")
    return int(n) if n is not None else None


def total_threads(client: Client) -> int:
    n = cached_threads(client)
    if n is None:  # before the client's first update only
        try:
            n = sum(client.nthreads().values())
        except Exception:
            n = 0
    return max(int(n or 0), 1)


async def scheduler_workers(client: Client) -> dict:
    """Every worker's entry of the scheduler's identity (runs on the client's loop)."""
    local = _in_process_scheduler(client)
    if local is not None and getattr(getattr(local, "loop", None), "asyncio_loop", None) is asyncio.get_running_loop():
        # A local cluster's scheduler runs on this very loop: its answer without a message to it and
        # back (which waited behind the start's TLS handshakes on the same thread, in a first map).
        return dict(local.identity(n_workers=-1).get("workers", {}))
    scheduler = client.scheduler
    assert scheduler is not None  # a connected client
    info = await scheduler.identity(n_workers=-1)
    return info.get("workers", {})


async def gather_skipping_errors(client: Client, futures: dict) -> dict:
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


def scatter_shared(client: Client, values: dict) -> dict:
    """Send large values to every worker once; name -> future."""
    names = list(values)
    try:
        futures = client.scatter([values[n] for n in names], broadcast=True, hash=False)
    except Exception as exc:
        raise ClusterError(f"sending the large values {', '.join(names)} to the workers failed: {exc}.") from exc
    return dict(zip(names, futures))


class Scattered:
    """A map's large values, sent once to every worker (``broadcast``); scattered again if a worker lost them.

    ``current()`` is name -> future (None when the map has none), as the
    task path's tasks and the direct path's own leases take them.
    """

    def __init__(self, client: Client, values: dict):
        self.client = client
        self.values = dict(values)
        self.futures: dict[str, Any] | None = scatter_shared(client, self.values) if self.values else None

    def current(self) -> dict[str, Any] | None:
        futures = self.futures
        if futures and not all(f.status == "finished" for f in futures.values()):
            self.futures = futures = scatter_shared(self.client, self.values)
        return futures

    def release(self) -> None:
        """Let the cluster forget the values, and this object the caller's."""
        if self.futures:
            release_futures(self.futures.values())
        self.futures = None
        self.values = {}


def client_loop(client: Client) -> asyncio.AbstractEventLoop:
    """The asyncio loop ``client`` runs on (distributed runs an ``AsyncIOLoop``)."""
    return client.loop.asyncio_loop  # type: ignore[union-attr]


def on_client_loop(client: Client, coro: Any) -> concurrent.futures.Future:
    """Run ``coro`` on ``client``'s event loop; a future this thread may wait on."""
    return asyncio.run_coroutine_threadsafe(coro, client_loop(client))


def task_state(fut: Any) -> str:
    """A task's state as its client knows it: "pending", "finished", "error", "cancelled" or "lost"."""
    return fut.status


def task_key(fut: Any) -> str:
    """A task's key (what names it in the scheduler and in a gather's answer)."""
    return fut.key


def cancel_task(fut: Any) -> None:
    """Cancel one task (the scheduler forgets it; a worker running it stops between items)."""
    fut.cancel()


def client_running(client: Client) -> bool:
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


def cancel_futures(client: Client, futures: list, reason: str) -> None:
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
def submit_call(client: Client, fn: Callable, *args: Any, key: str, on_done: Callable[[Any], None]) -> Any:
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


def finished_values(client: Client, futures: list) -> Iterator[tuple[bool, Any]]:
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
def run_on_every_worker(client: Client, fn: Callable, *args: Any) -> dict[str, Any]:
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
