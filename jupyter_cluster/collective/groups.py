"""The SPMD group: which workers are the ranks, reused while they live, and the calls that reach them.

:func:`prepare` picks the group the next ``%%spmd`` cell (or :func:`~jupyter_cluster.collective.client.spmd`
call) runs on: the one from before while its workers live (same N, same backend); else the workers
are probed (torch, GPUs), the backend chosen, and a new group made, with a one-line notice when one
existed.  Every check that can refuse happens there, before anything runs.  The group's
rendezvous (:func:`open_rendezvous`) is kept by rank 0's worker; ranks still busy with an
earlier cell are interrupted, then their workers restarted (:func:`_restart_stuck`).

The client keeps only what it needs to decide whether a group can be reused; per-rank state lives in
the worker processes (:mod:`~jupyter_cluster.collective.worker`).
"""

from __future__ import annotations

import inspect
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..cluster import session
from ..cluster.display import fmt_bytes
from ..engine.cluster import workers_now
from ..errors import ClusterError

if TYPE_CHECKING:
    from distributed import Client

#: how long interrupted ranks get to stop before the notebook stops waiting for them
STOP_WAIT_S = 1.5
#: how long the next cell waits for ranks of an interrupted or failed cell before restarting their workers
STUCK_WAIT_S = 5.0
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


# -- calls to the ranks' workers ----------------------------------------------------------------------
def _natural(name: Any) -> tuple:
    text = str(name)
    return (0, int(text), "") if text.isdigit() else (1, 0, text)


def _host(address: str) -> str:
    from distributed.comm import get_address_host

    return get_address_host(address)


def run_on(client: Client, fn: Callable, *args, workers: list[str], timeout: float = 30.0) -> dict[str, Any]:
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


def worker_module():
    """The ranks' module (:mod:`~jupyter_cluster.collective.worker`), whose functions ``Client.run`` sends by reference."""
    from . import worker as spmd_worker  # lazy: the ranks' module, pickled by reference, loads with the first group

    return spmd_worker


def interrupt_ranks(handle, group: Group, ranks: list[int], wait_s: float = STOP_WAIT_S) -> None:
    """Raise KeyboardInterrupt in these ranks' cells; waits at most ``wait_s`` (the request still goes out)."""
    addrs = [group.workers[r] for r in ranks]
    if not addrs:
        return
    try:
        run_on(handle.client, worker_module().interrupt, group.id, workers=addrs, timeout=wait_s)
    except Exception:  # the notebook must not wait on a worker that does not answer
        pass


def resolve_handle(cluster: Any):
    """The cluster a call names (a handle or its name), else the current one."""
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
    interrupt_ranks(handle, group, [group.workers.index(a) for a in addrs if a in group.workers])
    deadline = time.monotonic() + STUCK_WAIT_S
    while addrs:
        live = workers_now(handle.client)
        addrs = [a for a in addrs if a in live]
        try:
            states = run_on(handle.client, worker_module().status, workers=addrs, timeout=5) if addrs else {}
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
    infos = run_on(handle.client, worker_module().probe, workers=members, timeout=120)
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


def open_rendezvous(handle, group: Group) -> None:
    """A new rendezvous generation: rank 0's worker keeps its keys (see :class:`~jupyter_cluster.collective.rendezvous._StoreKeys`)."""
    group.generation += 1
    addr0 = group.workers[0]
    where = run_on(
        handle.client,
        worker_module().open_store,
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
            run_on(handle.client, worker_module().teardown, group.id, workers=members, timeout=15)
        except ClusterError:
            pass


def reset(cluster: Any = None) -> bool:
    """Tear down the current cluster's SPMD group: process groups destroyed, per-rank state dropped.

    Returns
    -------
    bool
        Whether there was a group.
    """
    handle = resolve_handle(cluster)
    with _lock:
        group = _groups.pop(handle.address, None)
    if group is None:
        return False
    _teardown(handle, group)
    return True


def group(cluster: Any = None) -> Group | None:
    """The current cluster's SPMD group (None before the first ``%%spmd``)."""
    handle = resolve_handle(cluster)
    with _lock:
        return _groups.get(handle.address)
