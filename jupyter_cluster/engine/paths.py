"""Which path a map's chunks take: the one module that builds a dispatcher, so the map knows neither.

:func:`open_dispatcher` picks on a map's first step: the direct path
(:class:`.direct.DirectDispatcher`: leases fed over Dask's comm) when the
client reaches the workers and nothing rules it out, else the task path
(:class:`.tasks.TaskDispatcher`: one Dask task per chunk), which
:func:`task_dispatcher` also makes for a map that falls back to it
(:class:`.dispatch.Fallback`).  Either path sends the map's one
:class:`.protocol.MapRun` (its function and how to run it) as it is.
"""

from __future__ import annotations

from .. import config
from .direct import DirectDispatcher
from .dispatch import Dispatcher, MapSpec
from .tasks import TaskDispatcher

__all__ = ["MapSpec", "open_dispatcher", "task_dispatcher"]


def open_dispatcher(spec: MapSpec, *, pinned: bool = False, empty: bool = False) -> Dispatcher:
    """The dispatcher a map starts with: direct when the workers answer this client, plain tasks otherwise.

    The task path also for a map pinned to given workers (``run_on_workers``,
    ``--all-workers``), for an empty input (nothing to place leases for) and
    with ``jupyter-cluster.engine.path: tasks``.
    """
    if not pinned and not empty and config.get("engine.path", "auto") != "tasks":
        direct = DirectDispatcher.open(spec)
        if direct is not None:
            return direct
    return task_dispatcher(spec)


def task_dispatcher(spec: MapSpec) -> Dispatcher:
    """The task path's dispatcher for a map (its start without the direct path, or its fallback)."""
    return TaskDispatcher(spec)
