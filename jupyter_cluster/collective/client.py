"""SPMD on the cluster: run code once on each of N workers as the ranks of a torch.distributed group.

``%%spmd`` (see :mod:`~jupyter_cluster.magics.spmd_magic`) and :func:`spmd` are the
two front ends of :func:`run`.  The flow of one call::

    pick the group ─► reuse it while its workers live (same N, same backend);
                      else probe the workers (torch, GPUs), choose the backend,
                      and make a new group (a one-line notice when one existed)
    rendezvous     ─► rank 0's worker holds the keys (Client.run); every rank joins with
                      init_process_group(store=...), the store reached over the Dask comm
                      (TLS on a local cluster); nothing new listens for it
    one task per rank, pinned: Client.submit(workers=[addr], allow_other_workers=False)
                   ─► spmd_worker.run_rank: env, group, the cell in the rank's namespace
    wait           ─► results and per-rank output; a failed rank cancels the others;
                      a lost worker or an interrupt ends the wait within seconds

Per-rank state lives in the worker processes (:mod:`~jupyter_cluster.collective.worker`),
so the client keeps only what it needs to decide whether a group can be reused.
This module knows nothing of IPython.
"""

from __future__ import annotations

import inspect
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..cell.capture import pickled_size
from ..cluster import session
from ..cluster.display import fmt_bytes
from ..engine.cluster import workers_now
from ..engine.worker import error_info
from ..errors import ClusterError
from ..tracking.progress import observer_factory

if TYPE_CHECKING:
    from distributed import Client

#: seconds a collective waits for its peers before it fails (``--timeout``)
DEFAULT_TIMEOUT = 300.0
#: after the first failed rank, how long the others get to finish on their own before they are interrupted
FAILURE_GRACE_S = 2.0
#: how long interrupted ranks get to stop before the notebook stops waiting for them
STOP_WAIT_S = 1.5
#: how long the next cell waits for ranks of an interrupted or failed cell before restarting their workers
STUCK_WAIT_S = 5.0
#: how often the wait loop asks the scheduler whether the group's workers are alive
LIVENESS_INTERVAL_S = 0.25
#: the largest captured-values payload sent inside the task; bigger ones are scattered to the ranks' workers
INLINE_PAYLOAD_BYTES = 1 << 20
BACKENDS = ("gloo", "nccl", "auto")


@dataclass
class Group:
    """The client's record of one SPMD group.

    Attributes
    ----------
    id : str
        Names the group on the workers; a new id means fresh per-rank namespaces.
    workers : list of str
        Worker addresses in rank order.
    names : list of str
        Their Dask worker names.
    hosts : list of str
        Their hosts (``MASTER_ADDR`` is ``hosts[0]``).
    backend : str
        ``"gloo"`` or ``"nccl"`` (``auto`` is resolved when the group is made).
    requested : str
        The backend asked for (``gloo``, ``nccl`` or ``auto``).
    generation : int
        Rendezvous number; a new one re-initialises the process group (after a
        failure) and keeps the per-rank namespaces.
    store : str or None
        The address of the worker that holds the current generation's rendezvous
        keys (rank 0's); None until a rendezvous is opened, and again after a
        failure, so that the next cell opens a new generation.
    """

    id: str
    workers: list[str]
    names: list[str]
    hosts: list[str]
    backend: str
    requested: str
    generation: int = 0
    store: str | None = None
    gpus: list[int] = field(default_factory=list)
    healthy: bool = False
    assigned: set[str] = field(default_factory=set)
    pending: list[Any] = field(default_factory=list)
    runs: int = 0

    @property
    def world_size(self) -> int:
        return len(self.workers)

    def spec(self, rank: int, timeout: float) -> dict[str, Any]:
        host = self.hosts[rank]
        same_host = [r for r, h in enumerate(self.hosts) if h == host]
        return {
            "group": self.id,
            "generation": self.generation,
            "rank": rank,
            "world_size": self.world_size,
            "local_rank": same_host.index(rank),
            "local_world_size": len(same_host),
            "host": self.hosts[0],
            "store": self.store,
            "bind": host,
            "backend": self.backend,
            "timeout": float(timeout),
        }


# scheduler address -> the group on that cluster
_groups: dict[str, Group] = {}
_lock = threading.RLock()


class SpmdJob:
    """One ``%%spmd`` cell or :func:`spmd` call: results, outputs, errors and timings per rank.

    It also has what the progress display reads (``total`` ranks, ``done``,
    ``failed``, ``state``), so the cell shows a progress bar and the sidebar
    lists it with the maps.
    """

    def __init__(self, label: str, world_size: int, client: Client, cluster: str | None):
        self.id = uuid.uuid4().hex[:12]
        self.label = label
        self.total = world_size
        self.done = 0
        self.failed = 0
        self.started = time.time()
        self.ended: float | None = None
        self.state = "running"
        self.finished = False
        self.client = client
        self.cluster = cluster
        self.values: dict[int, Any] = {}
        self.outputs: dict[int, str] = {}
        self.errors: dict[int, BaseException | None] = {}
        self.tracebacks: dict[int, tuple[str, dict | None]] = {}
        self.timings: dict[int, float] = {}
        self.failed_rank: int | None = None
        # The process group this job ran on (set by run(); read by the magic's notices).
        self.group: Any = None

    def _finish(self, state: str) -> None:
        self.state = state
        self.finished = True
        self.ended = time.time()

    def __repr__(self) -> str:
        return f"<SpmdJob {self.label!r} {self.state} ranks={self.total} done={self.done} failed={self.failed}>"


# -- backend choice -------------------------------------------------------------------------
def choose_backend(requested: str | None, gpus: list[int], names: list[str] | None = None) -> str:
    """Resolve ``gloo | nccl | auto`` for ranks with ``gpus[r]`` GPUs each.

    ``auto`` is nccl when every rank has a GPU and gloo otherwise; ``nccl``
    with a CPU-only rank raises one sentence naming the ranks.

    Examples
    --------
    >>> choose_backend("auto", [0, 0])
    'gloo'
    >>> choose_backend("auto", [1, 1])
    'nccl'
    """
    asked = (requested or "auto").lower()
    if asked not in BACKENDS:
        raise ClusterError(f"--backend takes gloo, nccl or auto, not {requested!r}.")
    if asked == "gloo":
        return "gloo"
    cpu = [r for r, g in enumerate(gpus) if g < 1]
    if asked == "auto":
        return "gloo" if cpu or not gpus else "nccl"
    if cpu:
        names = names or [str(r) for r in range(len(gpus))]
        which = ", ".join(f"{r} (worker {names[r]})" for r in cpu[:4]) + (", ..." if len(cpu) > 4 else "")
        plural = "s" if len(cpu) > 1 else ""
        raise ClusterError(
            f"--backend nccl needs a GPU on every rank, but rank{plural} {which} "
            f"{'have' if plural else 'has'} none; start GPU workers with %cluster start --gpus, or use --backend gloo."
        )
    return "nccl"


# -- cluster helpers ----------------------------------------------------------------------
def _natural(name: Any) -> tuple:
    text = str(name)
    return (0, int(text), "") if text.isdigit() else (1, 0, text)


def _host(address: str) -> str:
    from distributed.comm import get_address_host

    return get_address_host(address)


def _run_on(client: Client, fn: Callable, *args, workers: list[str], timeout: float = 30.0) -> dict[str, Any]:
    """``Client.run`` in a worker thread (not on the worker's event loop), bounded by ``timeout``.

    ``fn`` gets the worker as ``dask_worker=`` when its signature names it, as with ``Client.run``.
    """
    import functools

    wants_worker = "dask_worker" in inspect.signature(fn).parameters

    async def in_thread(*a, dask_worker=None, _fn=fn):
        import asyncio

        call = functools.partial(_fn, *a, **({"dask_worker": dask_worker} if wants_worker else {}))
        return await asyncio.get_running_loop().run_in_executor(None, call)

    box: dict[str, Any] = {}

    def call():
        try:
            box["value"] = client.run(in_thread, *args, workers=workers, on_error="return")
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            box["error"] = exc

    thread = threading.Thread(target=call, name="jupyter-cluster-spmd-run", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise ClusterError(f"the workers did not answer within {timeout:g} s; check the cluster with %cluster.")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _resolve_handle(cluster: Any):
    if cluster is None:
        handle = session.current()
        if handle is None:
            raise ClusterError("no cluster is running; start one with %cluster start (or jupyter_cluster.start()).")
        return handle
    if isinstance(cluster, str):
        return session.get(cluster)
    return cluster


# -- groups ---------------------------------------------------------------------------------
def _pick_members(live: dict[str, dict], n: int | None) -> list[str]:
    if not live:
        raise ClusterError("the cluster has no workers yet; wait for them or scale it up (%cluster scale N).")
    if n is not None and n < 1:
        raise ClusterError(f"--workers must be at least 1, not {n}.")
    if n is not None and n > len(live):
        raise ClusterError(
            f"%%spmd --workers {n} needs {n} workers but the cluster has {len(live)}; "
            f"scale it up with %cluster scale {n}, or ask for fewer ranks."
        )
    order = sorted(live, key=lambda a: (_host(a), _natural(live[a].get("name", a))))
    return order[: (n if n is not None else len(order))]


def _ranks(n: int) -> str:
    return f"{n} rank" + ("s" if n != 1 else "")


def _describe_change(old: Group, live: dict[str, dict], members: list[str]) -> str:
    gone = [f"rank {r} (worker {old.names[r]})" for r, a in enumerate(old.workers) if a not in live]
    if gone:
        why = f"{', '.join(gone)} left the cluster"
    elif len(members) != old.world_size:
        why = f"{_ranks(len(members))} {'were' if len(members) > 1 else 'was'} asked for instead of {old.world_size}"
    else:
        why = "the workers changed"
    return (
        f"%%spmd: {why}; rebuilt the process group with {_ranks(len(members))} "
        "(per-rank state from earlier cells is gone: rerun the cells that built it)."
    )


def _restart_stuck(handle, group: Group, notice: Callable[[str], None]) -> None:
    """Ranks still busy with an earlier (failed or interrupted) cell: wait a while, then restart their workers.

    Whether a rank is busy is asked of its worker (is the cell's thread still
    inside ``run_rank``?), not read from the task's future, whose state can
    lag behind the worker's after an interrupt.
    """
    unfinished = [(a, f) for a, f in group.pending if not f.done()]
    group.pending = []
    if not unfinished:
        return
    addrs = sorted({a for a, _ in unfinished})
    # a rank's task that has not started yet must not start now, with an old rendezvous
    handle.client.cancel([f for _, f in unfinished])
    # ask again (the interrupt went out without waiting), then give them time to unwind: a rank
    # that was running Python stops within a second or two even on a busy machine
    _interrupt_ranks(handle, group, [group.workers.index(a) for a in addrs if a in group.workers])
    deadline = time.monotonic() + STUCK_WAIT_S
    while addrs:
        live = workers_now(handle.client)
        addrs = [a for a in addrs if a in live]
        try:
            states = _run_on(handle.client, _worker_module().status, workers=addrs, timeout=5) if addrs else {}
        except ClusterError:
            states = {}
        addrs = [a for a in addrs if not isinstance(states.get(a), dict) or states[a].get("running")]
        if not addrs or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    stuck = addrs
    if not stuck:
        return
    addrs = sorted(set(stuck))
    live = workers_now(handle.client)
    addrs = [a for a in addrs if a in live]
    if not addrs:
        return
    ranks = ", ".join(str(group.workers.index(a)) for a in addrs if a in group.workers)
    one = len(addrs) == 1
    notice(
        f"%%spmd: rank{'' if one else 's'} {ranks} {'was' if one else 'were'} still busy with an earlier cell, inside a call "
        f"Python cannot interrupt; restarting {'its worker' if one else 'their workers'} so no rank stays stuck."
    )
    try:
        handle.client.restart_workers(addrs, timeout=60, raise_for_error=False)
    except Exception as exc:
        raise ClusterError(
            f"rank {ranks} is still running an earlier %%spmd cell and its worker cannot be restarted ({exc}); "
            "restart the cluster with %cluster restart."
        ) from None
    handle.client.wait_for_workers(len(live), timeout=60)


def _make_group(handle, members: list[str], live: dict[str, dict], requested: str) -> Group:
    """Probe the members (torch, GPUs) and resolve the backend; nothing has run yet."""
    infos = _run_on(handle.client, _worker_module().probe, workers=members, timeout=120)
    names = [str(live[a].get("name", a)) for a in members]
    for addr, name in zip(members, names):
        info = infos.get(addr)
        if (isinstance(info, BaseException) or info is None) and addr not in workers_now(handle.client):
            # seen on SLURM workers with 500 MiB: the nanny restarts a worker that imports torch over its limit
            limit = live[addr].get("memory_limit")
            raise ClusterError(
                f"worker {name} was lost while torch was imported on it ({info}); importing torch takes a few "
                f"hundred MB, past which a worker's nanny restarts it: give the workers more memory than "
                f"{fmt_bytes(limit) if limit else 'now'} (--memory-limit) and run the cell again."
            )
        if isinstance(info, BaseException) or info is None:
            raise ClusterError(
                f"worker {name} could not be asked about torch ({info}); check the cluster with %cluster."
            )
        if info.get("torch") is None or info.get("error"):
            raise ClusterError(
                f"torch.distributed is not usable on worker {name} ({info.get('error')}); install torch in the workers' environment."
            )
    gpus = [int(infos[a].get("gpus") or 0) for a in members]
    backend = choose_backend(requested, gpus, names)
    if backend == "nccl":
        missing = [n for a, n in zip(members, names) if not infos[a].get("nccl")]
        if missing:
            raise ClusterError(
                f"--backend nccl needs a torch build with NCCL, which worker {missing[0]} lacks; install a CUDA build of torch there, or use --backend gloo."
            )
    return Group(
        id=uuid.uuid4().hex,
        workers=list(members),
        names=names,
        hosts=[_host(a) for a in members],
        backend=backend,
        requested=(requested or "auto").lower(),
        gpus=gpus,
    )


class _OutputRouter:
    """One subscription per client to the ranks' live output; chunks are queued per job."""

    def __init__(self, client: Client):
        self.queues: dict[str, Any] = {}
        self.lock = threading.Lock()
        client.subscribe_topic(_worker_module().OUTPUT_TOPIC, self._on_event)

    def _on_event(self, event) -> None:  # on the client's event loop
        msg = event[1] if isinstance(event, (tuple, list)) and len(event) == 2 else event
        if not isinstance(msg, dict):
            return
        with self.lock:
            queue = self.queues.get(str(msg.get("job")))
        if queue is not None:
            queue.append(msg)

    def register(self, job: str):
        from collections import deque

        queue: deque = deque()
        with self.lock:
            self.queues[job] = queue
        return queue

    def unregister(self, job: str) -> None:
        with self.lock:
            self.queues.pop(job, None)


_routers: dict[str, _OutputRouter] = {}


def _router(client: Client) -> _OutputRouter | None:
    with _lock:
        router = _routers.get(client.id)
        if router is None:
            try:
                router = _routers[client.id] = _OutputRouter(client)
            except Exception:  # no live output; the results still carry it
                return None
        return router


def _worker_module():
    from . import worker as spmd_worker  # lazy: the ranks' module, pickled by reference, loads with the first group

    return spmd_worker


def prepare(handle, n: int | None = None, backend: str | None = None, notice: Callable[[str], None] = print) -> Group:
    """The group the next cell runs on: reused while its workers live, else made anew.

    Every check that can refuse (too few workers, nccl on CPU ranks, no
    torch) happens here, before anything runs.
    """
    client = handle.client
    requested = (backend or "auto").lower()
    if requested not in BACKENDS:
        raise ClusterError(f"--backend takes gloo, nccl or auto, not {backend!r}.")
    with _lock:
        old = _groups.get(handle.address)
    if old is not None and old.pending:
        _restart_stuck(handle, old, notice)
    live = workers_now(client)
    members = _pick_members(live, n)
    if old is not None:
        alive = all(a in live for a in old.workers)
        same_size = (n if n is not None else len(live)) == old.world_size
        same_members = alive and same_size and (n is not None or members == old.workers)
        # what the request means on the group's own ranks: `--backend gloo` after `auto` chose gloo keeps
        # the group, and nccl asked of its CPU ranks is refused here, before anything runs
        same_backend = requested == old.requested or (
            same_members and choose_backend(requested, old.gpus, old.names) == old.backend
        )
        if same_members and same_backend:
            return old
        group = _make_group(handle, members, live, requested)
        if alive and same_size and members == old.workers:
            notice(
                f"%%spmd: --backend {requested} differs from the group's ({old.requested}); rebuilt the process group "
                "(per-rank state from earlier cells is gone: rerun the cells that built it)."
            )
        else:
            notice(_describe_change(old, live, members))
        _teardown(handle, old)
    else:
        group = _make_group(handle, members, live, requested)
    with _lock:
        _groups[handle.address] = group
    return group


def _open_rendezvous(handle, group: Group) -> None:
    """A new rendezvous generation: rank 0's worker keeps its keys (see ``spmd_worker._StoreKeys``)."""
    group.generation += 1
    addr0 = group.workers[0]
    where = _run_on(
        handle.client,
        _worker_module().open_store,
        group.id,
        group.generation,
        workers=[addr0],
        timeout=60,
    )
    store = where.get(addr0)
    if not isinstance(store, str):
        raise ClusterError(
            f"rank 0's worker {group.names[0]} could not open the rendezvous ({store}); check the cluster with %cluster."
        )
    group.store = store


def _teardown(handle, group: Group) -> None:
    live = workers_now(handle.client)
    members = [a for a in group.workers if a in live]
    if members:
        try:
            _run_on(handle.client, _worker_module().teardown, group.id, workers=members, timeout=15)
        except ClusterError:
            pass


def reset(cluster: Any = None) -> bool:
    """Tear down the current cluster's SPMD group: process groups destroyed, per-rank state dropped.

    Returns
    -------
    bool
        Whether there was a group.
    """
    handle = _resolve_handle(cluster)
    with _lock:
        group = _groups.pop(handle.address, None)
    if group is None:
        return False
    _teardown(handle, group)
    return True


def group(cluster: Any = None) -> Group | None:
    """The current cluster's SPMD group (None before the first ``%%spmd``)."""
    handle = _resolve_handle(cluster)
    with _lock:
        return _groups.get(handle.address)


# -- running ----------------------------------------------------------------------------------
def _choose_failure(results: dict[int, dict]) -> int:
    """The rank whose failure caused the others': not collateral, earliest."""
    failed = [(r, res) for r, res in results.items() if not res.get("ok")]
    primary = [(r, res) for r, res in failed if not res.get("collateral")]
    pool = primary or failed
    return min(pool, key=lambda kv: (kv[1].get("failed_at", float("inf")), kv[0]))[0]


def _interrupt_ranks(handle, group: Group, ranks: list[int], wait_s: float = STOP_WAIT_S) -> None:
    """Raise KeyboardInterrupt in these ranks' cells; waits at most ``wait_s`` (the request still goes out)."""
    addrs = [group.workers[r] for r in ranks]
    if not addrs:
        return
    try:
        _run_on(handle.client, _worker_module().interrupt, group.id, workers=addrs, timeout=wait_s)
    except Exception:  # the notebook must not wait on a worker that does not answer
        pass


class _Observer:
    """Progress display and jobs-topic record of an SPMD job (never fails the job)."""

    def __init__(self, job: SpmdJob, progress: Any):
        self.obs = None
        try:
            self.obs = observer_factory(job, progress)
            if self.obs is not None:
                self.obs.job_started(job)
        except Exception:
            self.obs = None

    def __call__(self, method: str, job: SpmdJob) -> None:
        if self.obs is not None:
            try:
                getattr(self.obs, method)(job)
            except Exception:
                self.obs = None


def run(
    payload: dict[str, Any],
    *,
    cluster: Any = None,
    workers: int | None = None,
    backend: str | None = None,
    timeout: float | None = None,
    label: str = "%%spmd",
    on_output: Callable[[int, str, bool], None] | None = None,
    notice: Callable[[str], None] = print,
    progress: Any = None,
    handle: Any = None,
) -> SpmdJob:
    """Run ``payload`` once per rank; return the finished :class:`SpmdJob`.

    A failed rank raises its exception here (after the other ranks were
    stopped); ``job.failed_rank`` names it.  Used by the magic and by
    :func:`spmd`; the payload is ``{"kind": "cell", "func": CellFunction,
    "large": {...}}`` or ``{"kind": "fn", "fn": f, "args": ..., "kwargs": ...}``.
    """
    from distributed import wait

    handle = handle if handle is not None else _resolve_handle(cluster)
    timeout = DEFAULT_TIMEOUT if timeout is None else float(timeout)
    if timeout <= 0:
        raise ClusterError(f"--timeout must be a positive number of seconds, not {timeout:g}.")
    group = prepare(handle, workers, backend, notice)
    client = handle.client
    if group.store is None or not group.healthy:
        _open_rendezvous(handle, group)
    group.healthy = False  # until this cell succeeds
    group.runs += 1
    payload = _ship(client, group, payload)
    job = SpmdJob(label, group.world_size, client, getattr(handle, "name", None))
    job.group = group
    stream_out: Callable[[int, int, str], None] | None = getattr(on_output, "live", None)
    router = _router(client) if stream_out is not None else None
    chunks = router.register(job.id) if router is not None else None
    wants = getattr(on_output, "wants", lambda rank: False)
    futures: list = []
    observe = _Observer(job, progress)
    results: dict[int, dict] = {}
    lost: list[int] = []
    first_failure: float | None = None
    interrupted_others = False
    try:
        for rank, addr in enumerate(group.workers):
            spec = dict(group.spec(rank, timeout), job=job.id, stream=chunks is not None and wants(rank))
            futures.append(
                client.submit(
                    _worker_module().run_rank,
                    spec,
                    payload,
                    key=f"spmd-{group.id[:8]}-{group.runs}-rank-{rank}",
                    workers=[addr],
                    allow_other_workers=False,
                    pure=False,
                    retries=0,
                )
            )
        next_check = 0.0
        while len(results) < group.world_size:
            waiting = [f for r, f in enumerate(futures) if r not in results and r not in lost]
            if not waiting:
                break
            try:
                wait(waiting, timeout=0.1, return_when="FIRST_COMPLETED")
            except Exception:  # distributed's TimeoutError: nothing new yet
                pass
            for rank, fut in enumerate(futures):
                if rank in results or rank in lost or not fut.done():
                    continue
                results[rank] = _result_of(fut, rank)
                res = results[rank]
                if res.get("ok"):
                    job.done += 1
                else:
                    job.failed += 1
                    if first_failure is None:
                        first_failure = time.monotonic()
                observe("job_progress", job)
            while chunks and stream_out is not None:
                chunk = chunks.popleft()
                stream_out(chunk["rank"], chunk["offset"], chunk["text"])
            now = time.monotonic()
            if now >= next_check:
                next_check = now + LIVENESS_INTERVAL_S
                live = workers_now(client)
                for rank, addr in enumerate(group.workers):
                    if rank not in results and rank not in lost and addr not in live:
                        lost.append(rank)
                        if first_failure is None:
                            first_failure = now
            if first_failure is not None:
                if not interrupted_others and now - first_failure > FAILURE_GRACE_S:
                    interrupted_others = True
                    _interrupt_ranks(
                        handle, group, [r for r in range(group.world_size) if r not in results and r not in lost]
                    )
                elif interrupted_others and now - first_failure > FAILURE_GRACE_S + STOP_WAIT_S + 1.0:
                    break  # a rank stuck inside torch: the next cell restarts its worker
    except BaseException as exc:  # Ctrl-C, or anything else: no rank is left running unattended
        if router is not None:
            router.unregister(job.id)
        _interrupt_ranks(handle, group, [r for r in range(len(futures)) if r not in results], wait_s=0.3)
        group.pending = [(group.workers[r], f) for r, f in enumerate(futures) if not f.done()]
        group.store = None
        job._finish("cancelled")
        observe("job_finished", job)
        if isinstance(exc, KeyboardInterrupt):
            notice(
                "%%spmd: interrupted; every rank was sent KeyboardInterrupt and the process group will be "
                "re-initialised by the next %%spmd cell (per-rank state is kept)."
            )
        raise
    if router is not None and stream_out is not None:
        while chunks:
            chunk = chunks.popleft()
            stream_out(chunk["rank"], chunk["offset"], chunk["text"])
        router.unregister(job.id)
    unfinished = [f for r, f in enumerate(futures) if r not in results]
    group.pending = [(group.workers[r], f) for r, f in enumerate(futures) if r not in results and not f.done()]
    for rank in lost:
        client.cancel([futures[rank]])
    for rank, res in sorted(results.items()):
        job.outputs[rank] = res.get("output", "")
        job.timings[rank] = res.get("ended", 0.0) - res.get("started", 0.0)
        if res.get("ok"):
            job.values[rank] = res.get("value")
            if res.get("unsendable"):
                notice(f"%%spmd: rank {rank}'s result was left on the worker: {res['unsendable']}.")
        else:
            error, _tname, _msg, text, frames = res["error"]
            job.errors[rank] = error
            job.tracebacks[rank] = (text, frames)
    failed = [r for r, res in results.items() if not res.get("ok")]
    if on_output is not None:
        for rank in sorted(job.outputs):
            on_output(rank, job.outputs[rank], rank in failed)
    if lost:
        group.store = None  # the next cell sees the membership change and rebuilds the group (with a notice)
        job._finish("failed")
        observe("job_finished", job)
        which = ", ".join(f"rank {r} (worker {group.names[r]})" for r in lost)
        raise ClusterError(
            f"{which} died during the %%spmd cell (killed, or out of memory); the other ranks were stopped, the cluster "
            "is still usable, and the next %%spmd cell builds a new group on the workers present then."
        )
    if failed:
        group.store = None  # the next cell re-initialises the process group; per-rank namespaces stay
        job.failed_rank = _choose_failure(results)
        job._finish("failed")
        observe("job_finished", job)
        return job
    if unfinished:  # cannot happen without a failure or a loss; kept for safety
        group.store = None
        job._finish("failed")
        observe("job_finished", job)
        raise ClusterError("some ranks did not finish; the next %%spmd cell restarts their workers.")
    group.healthy = True
    job._finish("finished")
    observe("job_finished", job)
    return job


def _result_of(fut, rank: int) -> dict:
    """A rank's result dict; a task-level failure (e.g. unpickling on the worker) as a failed rank."""
    try:
        return fut.result()
    except BaseException as exc:  # noqa: BLE001
        now = time.time()
        return {
            "rank": rank,
            "ok": False,
            "error": error_info(exc),
            "failed_at": now,
            "collateral": False,
            "output": "",
            "started": now,
            "ended": now,
        }


def _ship(client: Client, group: Group, payload: dict[str, Any]) -> dict[str, Any]:
    """Large captured values travel once per rank's worker, scattered ahead of the tasks."""
    large = payload.get("large") or {}
    if not large:
        return payload
    total = sum(pickled_size(v)[0] for v in large.values())
    if total < INLINE_PAYLOAD_BYTES:
        return payload
    futures = client.scatter(dict(large), workers=group.workers, broadcast=True, hash=False)
    return dict(payload, large=futures)


def raise_failure(job: SpmdJob) -> None:
    """Raise the failed rank's exception, with its remote traceback attached."""
    rank = job.failed_rank
    exc = job.errors.get(rank) if rank is not None else None
    text, frames = job.tracebacks.get(rank, ("", None)) if rank is not None else ("", None)
    if exc is None:
        raise RuntimeError(f"rank {rank} failed:\n{text}")
    tb = None
    if frames:
        try:
            from tblib import Traceback

            tb = Traceback.from_dict(frames).as_traceback()
        except Exception:
            tb = None
    raise exc.with_traceback(tb)


# -- the Python API ---------------------------------------------------------------------------
def spmd(
    fn: Callable[..., Any],
    *args: Any,
    workers: int | None = None,
    backend: str = "auto",
    timeout: float | None = None,
    show: str | int | list[int] | None = 0,
    cluster: Any = None,
    **kwargs: Any,
) -> dict[int, Any]:
    """Call ``fn(*args, **kwargs)`` once on each of N workers, as the ranks of a torch.distributed group.

    The process group is initialised before ``fn`` runs (``RANK``,
    ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` set), so
    ``fn`` can call ``torch.distributed.all_reduce`` and friends directly.
    ``fn`` gets ``rank=``, ``world_size=`` and ``state=`` (the rank's
    persistent namespace, shared with ``%%spmd`` cells) when its signature
    names them.  The group is the one ``%%spmd`` uses: reused while its
    workers live.

    Parameters
    ----------
    fn : callable
        Runs on every rank; must be picklable (a notebook function is).
    *args, **kwargs
        Passed to ``fn`` on every rank.
    workers : int, optional
        Number of ranks (default: every worker).
    backend : {"auto", "gloo", "nccl"}
        ``auto`` is nccl when every rank's worker has a GPU, else gloo.
    timeout : float, optional
        Seconds a collective waits for its peers before it fails (default 300).
    show : int, list of int, "all" or None
        Whose printed output appears here, labelled ``[rank r]`` (default rank 0;
        a failing rank's output always appears).
    cluster : ClusterHandle or str, optional
        Default: the current cluster.

    Returns
    -------
    dict
        ``{rank: fn's return value}``.

    Raises
    ------
    ClusterError
        Before anything runs: too few workers, nccl on CPU ranks, no torch on a
        worker.  While running: a rank's worker died.
    Exception
        The first failing rank's own exception (the other ranks are stopped).

    Examples
    --------
    >>> def total(rank, world_size):                     # doctest: +SKIP
    ...     import torch, torch.distributed as dist
    ...     t = torch.tensor([rank + 1.0]); dist.all_reduce(t)
    ...     return t.item()
    >>> jupyter_cluster.spmd(total)                       # doctest: +SKIP
    {0: 3.0, 1: 3.0}
    """
    try:
        params: Mapping[str, inspect.Parameter] = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    inject = [n for n in ("rank", "world_size", "state") if n in params and n not in kwargs]
    payload = {"kind": "fn", "fn": fn, "args": args, "kwargs": kwargs, "inject": inject}
    name = getattr(fn, "__name__", "function")
    job = run(
        payload,
        cluster=cluster,
        workers=workers,
        backend=backend,
        timeout=timeout,
        label=f"spmd({name})",
        on_output=OutputPrinter(show),
    )
    if job.failed_rank is not None:
        raise_failure(job)
    return dict(job.values)


class OutputPrinter:
    """Prints the chosen ranks' output (and every failing rank's), each line labelled ``[rank r]``.

    Lines appear as the ranks print them (:meth:`live`, fed from the workers'
    stream); what had not arrived when the cell ended is printed from the
    result (:meth:`__call__`), so every line appears once, in order per rank.
    """

    def __init__(self, show: str | int | list[int] | None = 0):
        self.show = show
        self._consumed: dict[int, int] = {}
        self._partial: dict[int, str] = {}
        self._pending: dict[int, dict[int, str]] = {}

    def wants(self, rank: int) -> bool:
        s = self.show
        if s is None:
            return False
        if s == "all":
            return True
        if isinstance(s, int):
            return rank == s
        return rank in set(s)

    def live(self, rank: int, offset: int, text: str) -> None:
        """A chunk of ``rank``'s output starting at character ``offset``; whole lines are printed now."""
        if not self.wants(rank):
            return
        pending = self._pending.setdefault(rank, {})
        pending[offset] = text
        while True:
            got = self._consumed.get(rank, 0)
            starts = [o for o in pending if o <= got]
            if not starts:
                return
            for o in starts:
                chunk = pending.pop(o)
                if o + len(chunk) > got:
                    self._emit(rank, chunk[got - o :], failed=False, final=False)
                    break

    def _emit(self, rank: int, text: str, failed: bool, final: bool) -> None:
        self._consumed[rank] = self._consumed.get(rank, 0) + len(text)
        lines = (self._partial.pop(rank, "") + text).split("\n")
        if not final:
            self._partial[rank] = lines.pop()  # an unfinished line waits for the rest
        elif lines and lines[-1] == "":
            lines.pop()
        tag = f"[rank {rank}{', failed' if failed else ''}] "
        for line in lines:
            print(tag + line)

    def __call__(self, rank: int, text: str, failed: bool) -> None:
        """The cell ended: print what of ``rank``'s whole output ``text`` was not printed yet."""
        if not (failed or self.wants(rank)):
            return
        self._pending.pop(rank, None)
        rest = text[self._consumed.get(rank, 0) :]
        if rest or self._partial.get(rank):
            self._emit(rank, rest, failed, final=True)
