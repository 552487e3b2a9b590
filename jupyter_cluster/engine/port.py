"""What a map asks of a live cluster, in one place: the :class:`ClusterPort` a :class:`.job.MapJob` is given.

The map's loop (:mod:`.job`) holds no Dask: it gets its dispatchers
(:mod:`.paths`), the scattered large values, the scheduler watch, the worker
list and Dask's ``allowed-failures`` through this port.  :class:`LivePort`
is the one made from a ``distributed.Client`` (or a ``ClusterHandle``);
``tests/unit/test_job_loop.py`` gives a map a fake one whose dispatcher
returns scripted :class:`~.dispatch.MapEvent`\\ s, and so drives the loop with no
cluster, as distributed tests its worker state machine without a network.
"""

from __future__ import annotations

from typing import Any, Protocol

from ..errors import ClusterError
from .cluster import (
    Scattered,
    allowed_failures,
    cached_threads,
    client_of,
    client_running,
    workers_now,
)
from .demand import adaptive
from .dispatch import Dispatcher
from .paths import MapSpec, open_dispatcher, task_dispatcher
from .scheduler_watch import SchedulerWatch, scheduler_lost_error


class ClusterPort(Protocol):
    """The cluster as one map sees it.  Every method runs on the map's thread."""

    #: The ``distributed.Client`` (what :class:`.paths.MapSpec` carries; opaque to the map).
    client: Any
    #: How messages name the cluster: its name, its scheduler's address, or None.
    cluster: Any

    def scatter(self, values: dict) -> Scattered:
        """The map's large values, sent once to every worker (none: nothing is sent)."""
        ...

    def dispatcher(self, spec: MapSpec, *, pinned: bool, empty: bool) -> Dispatcher:
        """The dispatcher the map starts with (:func:`.paths.open_dispatcher`)."""
        ...

    def fallback(self, spec: MapSpec) -> Dispatcher:
        """The task path's dispatcher, for a map whose dispatcher reported :class:`~.dispatch.Fallback`."""
        ...

    def allowed_failures(self) -> int:
        """Dask's ``allowed-failures`` for this cluster (asked once, when a worker first dies)."""
        ...

    def running(self) -> bool:
        """Whether the client is connected now (False while it reconnects: nothing is sent then)."""
        ...

    def lost(self) -> bool:
        """Whether the scheduler is gone for good (:class:`.scheduler_watch.SchedulerWatch`)."""
        ...

    def lost_error(self, lost: str, redo: str) -> ClusterError:
        """The error to raise once :meth:`lost` says so."""
        ...

    def workers(self) -> dict[str, dict]:
        """The scheduler's workers now, ``{address: info}`` (a round trip)."""
        ...

    def threads(self) -> int | None:
        """Worker threads as of the client's last update (no round trip; None before the first)."""
        ...

    def adaptive(self) -> bool:
        """Whether the map tells the cluster how many workers it could use (:mod:`.demand`)."""
        ...


class LivePort:
    """A :class:`ClusterPort` over a ``distributed.Client`` or a ``ClusterHandle``."""

    def __init__(self, client: Any):
        self.client, self.cluster = client_of(client)
        self._watch = SchedulerWatch(self.client)

    def scatter(self, values: dict) -> Scattered:
        return Scattered(self.client, values)

    def dispatcher(self, spec: MapSpec, *, pinned: bool, empty: bool) -> Dispatcher:
        return open_dispatcher(spec, pinned=pinned, empty=empty)

    def fallback(self, spec: MapSpec) -> Dispatcher:
        return task_dispatcher(spec)

    def allowed_failures(self) -> int:
        return allowed_failures(self.client)

    def running(self) -> bool:
        return client_running(self.client)

    def lost(self) -> bool:
        return self._watch.lost()

    def lost_error(self, lost: str, redo: str) -> ClusterError:
        return scheduler_lost_error(self.client, lost, redo, cluster=self.cluster)

    def workers(self) -> dict[str, dict]:
        return workers_now(self.client)

    def threads(self) -> int | None:
        return cached_threads(self.client)

    def adaptive(self) -> bool:
        return adaptive(self.client)
