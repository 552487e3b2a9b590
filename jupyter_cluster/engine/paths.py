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

from collections.abc import Callable
from typing import Any, NamedTuple

from .. import config
from .cluster import Scattered
from .direct import DirectDispatcher
from .dispatch import Dispatcher
from .protocol import MapRun
from .tasks import TaskDispatcher


class MapSpec(NamedTuple):
    """What either path needs of a map to send its chunks."""

    client: Any  # distributed.Client
    map_id: str
    run: MapRun  # what the workers need: the function, its cache token, star, retries, timeout, capture
    shared: Scattered  # the map's large values (and the function, shared["__fn__"], when it is large)
    resources: dict | None
    concurrency: int | None  # most chunks running at once (None: every worker thread)
    check: Callable[[], None]  # raises once the scheduler is lost (called while waiting)


def open_dispatcher(spec: MapSpec, *, pinned: bool = False, empty: bool = False) -> Dispatcher:
    """The dispatcher a map starts with: direct when the workers answer this client, plain tasks otherwise.

    The task path also for a map pinned to given workers (``run_on_workers``,
    ``--all-workers``), for an empty input (nothing to place leases for) and
    with ``jupyter-cluster.engine.path: tasks``.
    """
    if not pinned and not empty and config.get("engine.path", "auto") != "tasks":
        direct = DirectDispatcher.open(
            spec.client, spec.map_id, spec.resources, spec.concurrency, spec.run, spec.shared.futures, spec.check
        )
        if direct is not None:
            return direct
    return task_dispatcher(spec)


def task_dispatcher(spec: MapSpec) -> Dispatcher:
    """The task path's dispatcher for a map (its start without the direct path, or its fallback)."""
    return TaskDispatcher(spec.client, spec.map_id, spec.run, spec.shared, spec.resources, spec.concurrency, spec.check)
