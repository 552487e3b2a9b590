"""Detached maps from the kernel's side: :func:`submit`, :func:`job`, :func:`jobs`.

A detached job is handed to the host of a kept cluster (:mod:`.host`) through
the store (:mod:`jupyter_cluster.state.job_store`): the kernel writes the
function, the items and the options there and posts a request; the host drives
it and writes each result as it arrives.  Any kernel or script of the same
user picks it up by name with :func:`job`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import cloudpickle

from .. import mapping
from ..cluster import session
from ..errors import ClusterError, SerializationError
from ..state import job_store
from ..tracking.record import origin
from .driver import host_alive
from .kept import is_kept

#: how long a submit waits for the host to take the job (seconds)
TAKE_TIMEOUT = 30.0
#: map options a detached job keeps (the rest belong to a map driven by the kernel)
_OPTIONS = ("chunksize", "retries", "timeout", "errors", "resources", "label", "shared", "capture_output")


def submit(
    fn: Callable,
    *iterables: Iterable,
    name: str,
    cluster: Any = None,
    notebook: str | None = None,
    cell: str | None = None,
    run_tag: Any = None,
    **options: Any,
) -> Job:
    """Map ``fn`` over ``iterables`` on a kept cluster, driven by its host; returns at once.

    Parameters
    ----------
    fn : callable
        As for :func:`jupyter_cluster.map`; it and the items must pickle (they
        are written to disk and read by the host).
    *iterables : iterable
        Read to the end now (a generator becomes a list).
    name : str
        The job's name, unique among this user's detached jobs.
    cluster : ClusterHandle or str, optional
        A kept cluster (``%cluster start --keep``); default: the current one.
    notebook, cell : str, optional
        Where the job came from, shown by :func:`jobs` and the panel.
    run_tag : ItemTag, optional
        A ``%%parallel`` sweep's tag (:class:`jupyter_cluster.tracking.tags.ItemTag`):
        the host's map is that run's, as in the kernel.
    **options
        ``chunksize``, ``retries``, ``timeout``, ``errors`` ("raise" or
        "collect": how :meth:`Job.result` gives failures back), ``resources``,
        ``label``, as for :func:`jupyter_cluster.map`.

    Returns
    -------
    Job

    Examples
    --------
    >>> import jupyter_cluster as jc
    >>> jc.start(keep=True, workers=2)                  # doctest: +SKIP
    >>> jc.submit(pow, range(10), [2] * 10, name="sq")  # doctest: +SKIP
    >>> jc.job("sq").result()                           # doctest: +SKIP
    [0, 1, 4, 9, 16, 25, 36, 49, 64, 81]
    """
    job_store.check_name(name)
    unknown = set(options) - set(_OPTIONS) - {"ordered", "progress"}
    if unknown:
        raise TypeError(f"submit() got options it does not take: {', '.join(sorted(unknown))}.")
    mapping.check_options(
        errors=options.get("errors", "raise"),
        chunksize=options.get("chunksize", "auto"),
        retries=options.get("retries", 0),
        timeout=options.get("timeout"),
        resources=options.get("resources"),
    )
    handle = _kept_cluster(cluster)
    if job_store.read_meta(name) is not None:
        raise ClusterError(
            f"a detached job named {name!r} already exists; choose another name, or drop it with "
            f"jupyter_cluster.job({name!r}).remove()."
        )
    if not iterables:
        raise TypeError("submit() needs at least one iterable.")
    lists = [list(it) for it in iterables]
    if len({len(it) for it in lists}) > 1:  # as zip(): the shortest decides
        n = min(len(it) for it in lists)
        lists = [it[:n] for it in lists]
    kept = {k: v for k, v in options.items() if k in _OPTIONS and v is not None}
    try:
        spec = cloudpickle.dumps({"fn": fn, "iterables": lists, "options": kept, "tag": run_tag})
    except Exception as exc:
        raise SerializationError(
            f"detached job {name!r} cannot be handed to the cluster's host: its function, items or captured "
            f"values do not pickle ({type(exc).__name__}: {exc}); make them plain data, or create what fails "
            "inside the cell."
        ) from None
    total = len(lists[0])
    # the host has no notebook and no cell: its run records carry the submitting kernel's
    source = origin()
    if notebook:
        source["notebook"] = notebook
    meta = {
        "name": name,
        "cluster": handle.name,
        "address": handle.address,
        "notebook": source["notebook"],
        "cell": cell,
        "origin": source,
        "label": kept.get("label") or getattr(fn, "__name__", type(fn).__name__),
        "errors": kept.get("errors", "raise"),
        "state": "submitted",
        "total": total,
        "done": 0,
        "failed": 0,
        "submitted": time.time(),
        "spec_bytes": len(spec),
    }
    job_store.create(name, spec, meta)
    job_store.post(handle.name, name, "run")
    handle_ = Job(name)
    handle_._wait_taken()
    return handle_


def _kept_cluster(cluster: Any) -> session.ClusterHandle:
    handle: Any
    if isinstance(cluster, str):
        handle = session.get(cluster) if cluster in {h.name for h in session.handles()} else session.connect(cluster)
    else:
        handle = cluster if cluster is not None else session.current()
    if handle is None:
        raise ClusterError(
            "a detached job needs a kept cluster and this kernel has none; start one with "
            "%cluster start --keep (jupyter_cluster.start(keep=True)) or attach with %cluster connect NAME."
        )
    if not is_kept(handle.name):
        raise ClusterError(
            f"cluster {handle.name!r} is not kept, so a detached job on it would die with this kernel; "
            "start one with %cluster start --keep (jupyter_cluster.start(keep=True)) and detach there."
        )
    return handle


class Job:
    """A detached job, from any process of its user: state, progress, results, cancel, resume.

    Attributes
    ----------
    name : str
    """

    def __init__(self, name: str):
        self.name = name

    # -- what it is ------------------------------------------------------------------
    @property
    def meta(self) -> dict[str, Any]:
        meta = job_store.read_meta(self.name)
        if meta is None:
            raise ClusterError(f"detached job {self.name!r} has been removed.")
        return meta

    @property
    def status(self) -> str:
        """``submitted``, ``running``, ``finished``, ``failed``, ``cancelled``, ``evicted`` or ``lost``.

        ``lost``: its host process died while it ran; the finished items'
        results are kept and :meth:`resume` runs the rest.
        """
        return _state(self.meta)

    @property
    def cluster(self) -> str:
        return str(self.meta.get("cluster"))

    @property
    def progress(self) -> tuple[int, int]:
        """``(items with a result, total)``, counted from the results on disk."""
        meta = self.meta
        return len(job_store.done_indices(self.name)), int(meta.get("total") or 0)

    @property
    def errors(self) -> dict[int, BaseException]:
        """Input index -> exception, for the items that failed."""
        return {
            i: value[0]
            for i, (kind, value) in job_store.read_results(self.name).items()
            if kind == job_store.KIND_ERROR
        }

    def __repr__(self) -> str:
        meta = self.meta
        done, total = self.progress
        return f"<detached job {self.name!r} on {meta.get('cluster')!r}: {_state(meta)}, {done}/{total}>"

    # -- waiting and results ----------------------------------------------------------
    def wait(self, timeout: float | None = None) -> str:
        """Block until the job ends (or is lost), at most ``timeout`` seconds; returns its state."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            state = self.status
            if state not in ("submitted", "running"):
                return state
            if deadline is not None and time.monotonic() >= deadline:
                return state
            time.sleep(0.1)

    def result(self, timeout: float | None = None) -> list:
        """The results in input order, once the job has finished.

        Failures follow the job's ``errors`` option: ``"raise"`` raises the
        first failed item's exception, ``"collect"`` puts exceptions in place.

        Raises
        ------
        TimeoutError
            When the job has not ended within ``timeout`` seconds.
        ClusterError
            When it was cancelled, lost, failed for another reason or evicted
            (:meth:`partial` still gives what finished).
        """
        state = self.wait(timeout)
        meta = self.meta
        if state in ("submitted", "running"):
            done, total = self.progress
            raise TimeoutError(f"detached job {self.name!r} is still running ({done}/{total}) after {timeout:g} s.")
        results = job_store.read_results(self.name)
        total = int(meta.get("total") or 0)
        errors = [i for i in sorted(results) if results[i][0] == job_store.KIND_ERROR]
        if errors and meta.get("errors") == "raise":
            raise results[errors[0]][1][0]
        if state != "finished":
            raise ClusterError(self._not_finished(meta, state, len(results), total))
        return [results[i][1][0] if results[i][0] == job_store.KIND_ERROR else results[i][1] for i in range(total)]

    def partial(self) -> dict[int, Any]:
        """Input index -> result (or exception) of every item finished so far."""
        return {i: v[0] if k == job_store.KIND_ERROR else v for i, (k, v) in job_store.read_results(self.name).items()}

    def _not_finished(self, meta: dict, state: str, done: int, total: int) -> str:
        why = f" ({meta['reason']})" if meta.get("reason") else ""
        if state == "lost":
            why = (
                f" (the host process of cluster {meta.get('cluster')!r}, pid {meta.get('host_pid')}, died while it ran)"
            )
        if state == "evicted":
            return f"detached job {self.name!r} was evicted{why}."
        return (
            f"detached job {self.name!r} is {state}{why} with {done} of {total} items done; "
            f"job({self.name!r}).partial() gives them, job({self.name!r}).resume() runs the rest."
        )

    # -- control ---------------------------------------------------------------------
    def cancel(self, timeout: float = 15.0) -> str:
        """Stop the job: what finished stays on disk; returns its state."""
        meta = self.meta
        if _state(meta) not in ("submitted", "running"):
            return _state(meta)
        if not host_alive(meta) and meta.get("state") == "running":
            job_store.update_meta(self.name, state="cancelled", reason="cancelled on request", ended=time.time())
            return "cancelled"
        job_store.post(str(meta.get("cluster")), self.name, "cancel")
        return self.wait(timeout)

    def resume(self, cluster: Any = None) -> Job:
        """Run the items that have no result yet (after a lost host, a cancel or a failure).

        Parameters
        ----------
        cluster : ClusterHandle or str, optional
            A kept cluster to run them on; default: the job's own cluster if it
            still runs, else this kernel's current cluster.
        """
        meta = self.meta
        state = _state(meta)
        if state in ("submitted", "running"):
            raise ClusterError(f"detached job {self.name!r} is still {state}; nothing to resume.")
        if state == "evicted":
            raise ClusterError(f"detached job {self.name!r} was evicted, so it cannot be resumed.")
        if cluster is None and is_kept(str(meta.get("cluster"))):
            cluster = str(meta.get("cluster"))
        handle = _kept_cluster(cluster)
        job_store.update_meta(self.name, state="submitted", cluster=handle.name, address=handle.address)
        job_store.post(handle.name, self.name, "resume")
        self._wait_taken()
        return self

    def remove(self) -> None:
        """Delete the job and its results (refused while it runs: cancel it first)."""
        if self.status in ("submitted", "running"):
            raise ClusterError(f"detached job {self.name!r} is running; cancel() it first.")
        job_store.remove(self.name)

    def _wait_taken(self) -> None:
        deadline = time.monotonic() + TAKE_TIMEOUT
        while time.monotonic() < deadline:
            meta = self.meta
            if meta.get("state") != "submitted":
                return
            time.sleep(0.01)
        raise ClusterError(
            f"the host of cluster {meta.get('cluster')!r} did not take detached job {self.name!r} within "
            f"{TAKE_TIMEOUT:g} s; is the cluster still running (%cluster list)?"
        )

    def summary_line(self) -> str:
        """The one line a detached cell prints."""
        meta = self.meta
        return (
            f"Detached job {self.name!r} ({meta.get('total')} items) runs on kept cluster {meta.get('cluster')!r}; "
            f"get it back from any kernel with jupyter_cluster.job({self.name!r}).result() "
            f"or %cluster job {self.name} --out NAME."
        )


def _state(meta: dict[str, Any]) -> str:
    state = str(meta.get("state"))
    if state == "running" and not host_alive(meta):
        return "lost"
    return state


def job(name: str) -> Job:
    """The detached job ``name`` (from any kernel or script of this user).

    Raises
    ------
    ClusterError
        When there is no such job (the message lists those that exist).
    """
    if not job_store.valid_name(name) or job_store.read_meta(name) is None:
        known = ", ".join(job_store.names()) or "none"
        raise ClusterError(f"no detached job named {name!r} (known: {known}); see jupyter_cluster.jobs().")
    return Job(name)


def jobs() -> list[dict[str, Any]]:
    """Every detached job of this user, oldest first: name, cluster, notebook, cell, state, done/total, times."""
    job_store.evict_expired()  # results past detached.result-ttl show as evicted, with the reason
    out = []
    for name in job_store.names():
        meta = job_store.read_meta(name)
        if meta is None:
            continue
        started = meta.get("running_since") or meta.get("submitted")
        end = meta.get("ended") or time.time()
        out.append(
            {
                "name": name,
                "cluster": meta.get("cluster"),
                "notebook": meta.get("notebook"),
                "cell": meta.get("cell"),
                "state": _state(meta),
                "done": int(meta.get("done") or 0),
                "failed": int(meta.get("failed") or 0),
                "total": int(meta.get("total") or 0),
                "submitted": meta.get("submitted"),
                "started": started,
                "duration": max(0.0, end - started) if isinstance(started, (int, float)) else None,
                "reason": meta.get("reason"),
            }
        )
    return out
