"""The map front: :func:`map`, :func:`imap`, and :func:`run_on_workers` / :func:`all_workers_job` (``%%parallel --all-workers``).

``%%parallel``, ``Pool`` and these functions are front ends to the one map
engine, :mod:`jupyter_cluster.engine` (the job and its dispatch loop in
:mod:`~jupyter_cluster.engine.job`, batch sizing in
:mod:`~jupyter_cluster.engine.planner`, everything that touches Dask in
:mod:`~jupyter_cluster.engine.direct` / :mod:`~jupyter_cluster.engine.tasks` (the two paths), what runs on the workers in
:mod:`~jupyter_cluster.engine.worker`).  This module finds the cluster to
run on (the current one, started if there is none) and re-exports the
engine's public names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from .cluster import session
from .engine.cluster import workers_now
from .engine.job import (  # noqa: F401  (re-exported: the engine's public names)
    MapJob,
    RemoteItemError,
    abbreviate,
    add_observer_factory,
    check_options,
    last_job,
    remove_observer_factory,
)
from .errors import ClusterError


def imap(fn: Callable, *iterables: Iterable, **options: Any) -> MapJob:
    """Map ``fn`` over ``iterables`` on the cluster, lazily.

    Parameters
    ----------
    fn : callable
        Called as ``fn(item)`` (or ``fn(*items)`` with several iterables, like
        the builtin ``map``) on the workers.
    *iterables : iterable
        Inputs; read lazily with a bounded distance ahead of the results.
    chunksize : int or "auto"
        Items per Dask task; "auto" adapts to measured item durations.
    ordered : bool
        Yield in input order (True) or in completion order (False).
    retries : int
        Re-run an item that raised up to this many times (on the same worker).
    timeout : float, optional
        Seconds an item may run; a slower item fails with ``TimeoutError``.
    errors : {"raise", "collect"}
        Raise the first failure (cancelling the rest), or put exception
        objects in place of results.
    resources : dict, optional
        Dask worker resources each chunk needs, e.g. ``{"GPU": 1}``.
    progress : bool, optional
        Show progress (None: automatic); passed to the observer factories.
    client : distributed.Client or ClusterHandle, optional
        Where to run; default: the current cluster (started if there is none).
    label : str, optional
        Name shown in progress displays.
    retain : bool
        Keep yielded results in ``job.results`` (default False for imap).

    Returns
    -------
    MapJob

    Examples
    --------
    >>> import jupyter_cluster as jc
    >>> for y in jc.imap(abs, [-1, -2, 3]):  # doctest: +SKIP
    ...     print(y)
    1
    2
    3
    """
    options.setdefault("retain", False)
    options["client"] = _resolve(options.get("client"))
    return MapJob(fn, iterables, **options)


def map(fn: Callable, *iterables: Iterable, **options: Any) -> list:
    """Map ``fn`` over ``iterables`` on the cluster and return the list of results.

    Same options as :func:`imap`.  Results come in input order (completion
    order with ``ordered=False``).  On ``KeyboardInterrupt`` the results
    finished so far stay in :func:`last_job` ``().results``.  Once it has
    returned, nothing of jupyter_cluster holds the results or the inputs: they
    live as long as the caller keeps them (:meth:`MapJob.take_results`).

    Examples
    --------
    >>> import jupyter_cluster as jc
    >>> jc.map(lambda x: x * x, range(5))  # doctest: +SKIP
    [0, 1, 4, 9, 16]
    """
    options.setdefault("retain", True)
    options["client"] = _resolve(options.get("client"))
    job = MapJob(fn, iterables, **options)
    job.run()
    return job.take_results()  # the list is the caller's; the finished job keeps only its record


def all_workers_job(fn: Callable, **options: Any) -> MapJob:
    """A job that runs ``fn(worker_address)`` once on every worker connected now (not started yet).

    The run-on-every-worker path for user code: :func:`run_on_workers` runs it, and
    ``%%parallel --all-workers`` drives it itself (interrupt handling, output
    printer).  One item per worker, each pinned to its worker, so a worker lost
    meanwhile fails its item instead of running it elsewhere.  It is a job, not
    :func:`~jupyter_cluster.engine.cluster.run_on_every_worker` (each worker's
    event loop, which ``Pool`` uses for its cleanup), so that user code runs in a
    worker thread with output capture, timeouts, progress and interrupts instead
    of stopping the worker's heartbeats while it runs.

    Parameters
    ----------
    fn : callable
        Called as ``fn(worker_address)`` on that worker.
    **options
        :class:`MapJob` options (``client``, ``label``, ``on_output``, ...);
        ``chunksize`` is always 1.

    Returns
    -------
    MapJob
        ``job.pinned`` lists the worker addresses, sorted; ``job.results``
        maps a position in it to that worker's result.

    Raises
    ------
    ClusterError
        When the cluster has no workers.
    """
    handle = options["client"] = _resolve(options.get("client"))
    client = getattr(handle, "client", handle)
    workers = sorted(workers_now(client))
    if not workers:
        raise ClusterError("the cluster has no workers yet; wait for them or scale it up (%cluster scale N).")
    options.setdefault("retain", True)
    options["chunksize"] = 1
    job = MapJob(fn, (workers,), pin_workers=workers, **options)
    job.pinned = workers
    return job


def run_on_workers(fn: Callable, **options: Any) -> MapJob:
    """Run ``fn(worker_address)`` once on every worker connected now; returns the finished job.

    Same options as :func:`all_workers_job`; ``job.results`` maps the position
    in ``job.pinned`` (the worker addresses) to the result.
    """
    job = all_workers_job(fn, **options)
    job.run()
    return job


def _resolve(cluster: Any) -> Any:
    return session.resolve(cluster)


# Progress bars (and the sidebar's job list) for every map, wherever it is made; not in a worker
# process, which imports this module only for a map made inside a task.
from ._core.context import in_worker_process  # noqa: E402

if not in_worker_process():
    from .tracking.progress import install as _install_progress

    _install_progress(add_observer_factory)
