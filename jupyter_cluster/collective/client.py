"""SPMD on the cluster: run code once on each of N workers as the ranks of a torch.distributed group.

``%%spmd`` (see :mod:`~jupyter_cluster.magics.spmd_magic`) and :func:`spmd` are the
two front ends of :func:`run`.  The flow of one call::

    pick the group ─► reuse it while its workers live (same N, same backend);
                      else probe the workers (torch, GPUs), choose the backend,
                      and make a new group (a one-line notice when one existed)
                      (collective.groups)
    rendezvous     ─► rank 0's worker holds the keys (Client.run); every rank joins with
                      init_process_group(store=...), the store reached over the Dask comm
                      (TLS on a local cluster); nothing new listens for it (collective.rendezvous)
    one task per rank, pinned: Client.submit(workers=[addr], allow_other_workers=False)
                   ─► collective.task.run_rank: env, group, the cell in the rank's namespace
    wait           ─► results and per-rank output (collective.output); a failed rank cancels
                      the others; a lost worker or an interrupt ends the wait within seconds

This module knows nothing of IPython.
"""

from __future__ import annotations

import inspect
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..cell.capture import pickled_size
from ..engine.cluster import workers_now
from ..engine.worker import error_info
from ..errors import ClusterError
from ..tracking.progress import observer_factory
from .groups import BACKENDS, STOP_WAIT_S, Group, interrupt_ranks, open_rendezvous, prepare, resolve_handle
from .output import LiveOutput, OutputPrinter

if TYPE_CHECKING:
    from distributed import Client, Future

# BACKENDS: what the magic's option table lists (tests/cluster/test_startup.py checks the two agree)
__all__ = ["BACKENDS", "DEFAULT_TIMEOUT", "OutputPrinter", "SpmdJob", "raise_failure", "run", "spmd"]

#: seconds a collective waits for its peers before it fails (``--timeout``)
DEFAULT_TIMEOUT = 300.0
#: after the first failed rank, how long the others get to finish on their own before they are interrupted
FAILURE_GRACE_S = 2.0
#: how often the wait loop asks the scheduler whether the group's workers are alive
LIVENESS_INTERVAL_S = 0.25
#: the largest captured-values payload sent inside the task; bigger ones are scattered to the ranks' workers
INLINE_PAYLOAD_BYTES = 1 << 20


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
    handle = handle if handle is not None else resolve_handle(cluster)
    timeout = DEFAULT_TIMEOUT if timeout is None else float(timeout)
    if timeout <= 0:
        raise ClusterError(f"--timeout must be a positive number of seconds, not {timeout:g}.")
    group = prepare(handle, workers, backend, notice)
    payload = _begin(handle, group, payload)
    job = SpmdJob(label, group.world_size, handle.client, getattr(handle, "name", None))
    job.group = group
    live = LiveOutput(handle.client, job.id, on_output)
    observe = _Observer(job, progress)
    ranks = _Ranks(handle, group, job, observe)
    try:
        ranks.submit(payload, timeout, live)
        ranks.wait(live)
    except BaseException as exc:  # Ctrl-C, or anything else: no rank is left running unattended
        live.close(relay=False)
        ranks.abandon()
        if isinstance(exc, KeyboardInterrupt):
            notice(
                "%%spmd: interrupted; every rank was sent KeyboardInterrupt and the process group will be "
                "re-initialised by the next %%spmd cell (per-rank state is kept)."
            )
        raise
    live.close()
    ranks.settle(on_output, notice)
    return ranks.conclude()


def _begin(handle, group: Group, payload: dict[str, Any]) -> dict[str, Any]:
    """Ready the group for a new cell (a new rendezvous after a failure) and ship the payload's large values."""
    if group.store is None or not group.healthy:
        open_rendezvous(handle, group)
    group.healthy = False  # until this cell succeeds
    group.runs += 1
    return _ship(handle.client, group, payload)


def _rank_task() -> Callable[..., dict[str, Any]]:
    from . import task  # lazy: the ranks' module, pickled by reference, loads with the first cell

    return task.run_rank


@dataclass
class _Ranks:
    """The ranks' tasks of one run and what came back from them: submitted, waited for, settled into the job."""

    handle: Any
    group: Group
    job: SpmdJob
    observe: _Observer
    futures: list[Future] = field(default_factory=list)
    results: dict[int, dict] = field(default_factory=dict)
    lost: list[int] = field(default_factory=list)
    first_failure: float | None = None
    interrupted_others: bool = False

    def submit(self, payload: dict[str, Any], timeout: float, live: LiveOutput) -> None:
        """One task per rank, pinned to its worker."""
        group, run_rank = self.group, _rank_task()
        for rank, addr in enumerate(group.workers):
            spec = dict(group.spec(rank, timeout), job=self.job.id, stream=live.streams(rank))
            self.futures.append(
                self.handle.client.submit(
                    run_rank,
                    spec,
                    payload,
                    key=f"spmd-{group.id[:8]}-{group.runs}-rank-{rank}",
                    workers=[addr],
                    allow_other_workers=False,
                    pure=False,
                    retries=0,
                )
            )

    def _open(self) -> list[int]:
        """Ranks neither finished nor lost."""
        return [r for r in range(len(self.futures)) if r not in self.results and r not in self.lost]

    def wait(self, live: LiveOutput) -> None:
        """Until every rank finished or was lost, relaying output; a failure stops the other ranks."""
        from distributed import wait

        next_check = 0.0
        while len(self.results) < self.group.world_size:
            waiting = [self.futures[r] for r in self._open()]
            if not waiting:
                break
            try:
                wait(waiting, timeout=0.1, return_when="FIRST_COMPLETED")
            except Exception:  # distributed's TimeoutError: nothing new yet
                pass
            self._collect()
            live.relay()
            now = time.monotonic()
            if now >= next_check:
                next_check = now + LIVENESS_INTERVAL_S
                self._find_lost(now)
            if self.first_failure is not None and self._stop_others(now):
                break  # a rank stuck inside torch: the next cell restarts its worker

    def _collect(self) -> None:
        """Take the results of the ranks that finished."""
        for rank, fut in enumerate(self.futures):
            if rank in self.results or rank in self.lost or not fut.done():
                continue
            res = self.results[rank] = _result_of(fut, rank)
            if res.get("ok"):
                self.job.done += 1
            else:
                self.job.failed += 1
                if self.first_failure is None:
                    self.first_failure = time.monotonic()
            self.observe("job_progress", self.job)

    def _find_lost(self, now: float) -> None:
        """Ranks whose worker left the cluster."""
        live = workers_now(self.handle.client)
        for rank, addr in enumerate(self.group.workers):
            if rank not in self.results and rank not in self.lost and addr not in live:
                self.lost.append(rank)
                if self.first_failure is None:
                    self.first_failure = now

    def _stop_others(self, now: float) -> bool:
        """After a failure: interrupt the ranks still running once the grace is over; True when waiting is over."""
        assert self.first_failure is not None
        if not self.interrupted_others and now - self.first_failure > FAILURE_GRACE_S:
            self.interrupted_others = True
            interrupt_ranks(self.handle, self.group, self._open())
        elif self.interrupted_others and now - self.first_failure > FAILURE_GRACE_S + STOP_WAIT_S + 1.0:
            return True
        return False

    def abandon(self) -> None:
        """The wait was interrupted: every rank still running is too; the next cell re-initialises the group."""
        group, futures = self.group, self.futures
        interrupt_ranks(self.handle, group, [r for r in range(len(futures)) if r not in self.results], wait_s=0.3)
        group.pending = [(group.workers[r], f) for r, f in enumerate(futures) if not f.done()]
        group.store = None
        self.job._finish("cancelled")
        self.observe("job_finished", self.job)

    def settle(self, on_output: Callable[[int, str, bool], None] | None, notice: Callable[[str], None]) -> None:
        """Results, outputs, errors and timings into the job; each rank's output to ``on_output``."""
        group, futures, job = self.group, self.futures, self.job
        group.pending = [(group.workers[r], f) for r, f in enumerate(futures) if r not in self.results and not f.done()]
        for rank in self.lost:
            self.handle.client.cancel([futures[rank]])
        for rank, res in sorted(self.results.items()):
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
        if on_output is not None:
            failed = self._failed()
            for rank in sorted(job.outputs):
                on_output(rank, job.outputs[rank], rank in failed)

    def _failed(self) -> list[int]:
        return [r for r, res in self.results.items() if not res.get("ok")]

    def conclude(self) -> SpmdJob:
        """The job's end: finished, failed with a rank's own exception (``failed_rank``), or a lost rank raised."""
        group, job = self.group, self.job
        if self.lost:
            group.store = None  # the next cell sees the membership change and rebuilds the group (with a notice)
            self._finish("failed")
            which = ", ".join(f"rank {r} (worker {group.names[r]})" for r in self.lost)
            raise ClusterError(
                f"{which} died during the %%spmd cell (killed, or out of memory); the other ranks were stopped, the cluster "
                "is still usable, and the next %%spmd cell builds a new group on the workers present then."
            )
        if self._failed():
            group.store = None  # the next cell re-initialises the process group; per-rank namespaces stay
            job.failed_rank = _choose_failure(self.results)
            self._finish("failed")
            return job
        if len(self.results) < len(self.futures):  # cannot happen without a failure or a loss; kept for safety
            group.store = None
            self._finish("failed")
            raise ClusterError("some ranks did not finish; the next %%spmd cell restarts their workers.")
        group.healthy = True
        self._finish("finished")
        return job

    def _finish(self, state: str) -> None:
        self.job._finish(state)
        self.observe("job_finished", self.job)


def _choose_failure(results: dict[int, dict]) -> int:
    """The rank whose failure caused the others': not collateral, earliest."""
    failed = [(r, res) for r, res in results.items() if not res.get("ok")]
    primary = [(r, res) for r, res in failed if not res.get("collateral")]
    pool = primary or failed
    return min(pool, key=lambda kv: (kv[1].get("failed_at", float("inf")), kv[0]))[0]


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
