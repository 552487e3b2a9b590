"""Demand: a direct-path map tells an adaptive cluster how many more worker threads it could use.

Leases hide a map's backlog from the scheduler: a map runs through one
lease task per worker thread and feeds them batches over Dask's comm, so
Dask sees one long task per thread and nothing waiting, and adaptive
scaling (Dask's ``Adaptive``, which asks ``Scheduler.adaptive_target``)
never adds a worker for it; with no workers at all the map would wait
forever.  So while a map has more work than its leases can take, it keeps
*demand tasks* on the scheduler: one per worker thread it could use beyond
its leases (:func:`wanted_threads`), with the map's resources, restricted to
a host that never exists (:data:`NOWHERE`) so that they never run.  Dask
counts them as unrunnable tasks, exactly as it counts a backlog of plain
tasks, so every adaptive mode that reads the scheduler's target grows the
cluster: ``LocalCluster.adapt``, dask-jobqueue's and ``SSHCluster``'s
``adapt`` (Dask's ``Adaptive`` in the notebook) and a dask-gateway cluster's
adaptive mode (the same target, read by the gateway).  Their keys share the
lease tasks' prefix (``jc-lease``), so Dask prices each like a lease (twice
the longest-running lease so far): one demand task asks for about one more
thread.  When a worker joins, the map places its own pinned leases there as
it does for any new worker (:meth:`.direct.DirectDispatcher._place`) and
keeps fewer demand tasks; when its work runs out, or it ends, it releases
them, and the cluster shrinks back once its leases end (``engine.linger``)
and Dask's ``Adaptive`` has waited its ``wait-count``.

Why tasks that never run rather than unpinned leases that become the map's
leases where a new worker starts them: Dask sends an unpinned task to a
busy worker at once (it queues only large groups of unrestricted tasks), so
such a request would sit behind that worker's leases, and only work stealing
(a heuristic that may be switched off) would move it to the new worker; and
the client would have to find out where each one started.  Never-running
requests leave placement to the one code path that already places leases,
and cost nothing where the scheduler hands them out to nobody.

They are only kept where something reads them (:func:`adaptive`): the
client's cluster adapts through Dask's ``Adaptive`` in this process, or its
scaling is out of the notebook's sight (a cluster object that is not a Dask
``Cluster``, such as a dask-gateway cluster, whose adaptive mode runs in the
gateway); ``jupyter-cluster.engine.demand`` (``auto``, ``true``, ``false``)
overrides that.  On a fixed cluster they would only show in Dask's
dashboard as tasks no worker can run.
"""

from __future__ import annotations

import itertools
import logging
import math
from typing import Any

from distributed import Client

from .. import config

logger = logging.getLogger(__name__)

#: The host every demand task is restricted to: none has this name (``.invalid`` is reserved, RFC 2606).
NOWHERE = "jc-demand.invalid"
#: Most demand tasks one map keeps (an adaptive cluster's maximum caps what it does with them anyway).
MAX_DEMAND = 256

_numbers = itertools.count()


def _wanted(n: int) -> int:
    """A demand task's function; it never runs (see :data:`NOWHERE`)."""
    return n


def _adaptive_object(client: Client) -> Any:
    return getattr(getattr(client, "cluster", None), "_adaptive", None)


def adaptive(client: Client) -> bool:
    """Whether a map on ``client``'s cluster should tell it how many workers it could use.

    ``jupyter-cluster.engine.demand``: ``true`` always, ``false`` never,
    ``auto`` (the default) when the cluster adapts through Dask's
    ``Adaptive`` here, or when its scaling is out of the notebook's sight
    (its cluster object is not a Dask ``Cluster``: a dask-gateway cluster).
    A client connected by address has no cluster object: nothing to tell.
    """
    setting = config.get("engine.demand", "auto")
    if isinstance(setting, str) and setting.lower() in ("true", "false"):
        setting = setting.lower() == "true"
    if isinstance(setting, bool):
        return setting
    cluster = getattr(client, "cluster", None)
    if cluster is None:
        return False
    ad = _adaptive_object(client)
    if ad is not None:
        return getattr(ad, "state", None) in ("starting", "running")
    from distributed.deploy import Cluster

    return not isinstance(cluster, Cluster)


def target_duration(client: Client) -> float:
    """Seconds of work a worker thread should have, as the cluster's adaptive scaling counts it."""
    ad = _adaptive_object(client)
    seconds = getattr(ad, "target_duration", None)
    if seconds is None:
        import dask
        from dask.utils import parse_timedelta

        seconds = parse_timedelta(dask.config.get("distributed.adaptive.target-duration", "5s"))
    return max(float(seconds), 1e-3)


def wanted_threads(
    live: int, remaining: int | None, per_item: float | None, target: float, limit: int | None = None
) -> int:
    """How many worker threads beyond its ``live`` leases a map with work left could use.

    As Dask scales for plain tasks: enough threads to run what is left
    (``remaining`` items of ``per_item`` seconds) in about ``target``
    seconds, no more threads than items left, nor beyond the map's own
    ``limit`` (``Pool(processes=N)``).  While the work is unknown (nothing
    has run yet, or the input has no length) one more thread at a time; a
    map with no lease at all always asks for one.
    """
    if remaining is None or per_item is None:
        extra = 1
    else:
        extra = min(math.ceil(remaining * per_item / target) - live, remaining)
        if live == 0 and remaining > 0:
            extra = max(extra, 1)
    if limit is not None:
        extra = min(extra, limit - live)
    return max(0, min(extra, MAX_DEMAND))


class Demand:
    """The demand tasks of one direct-path map (see the module's docstring).

    Parameters
    ----------
    client : distributed.Client
    map_id : str
        Names the tasks (``jc-lease-<map_id>-want-<n>``: the lease tasks' prefix, priced like them).
    resources : dict or None
        The map's resources (each of its leases needs them).
    limit : int or None
        Most leases the map uses at once.
    """

    def __init__(self, client: Client, map_id: str, resources: dict | None, limit: int | None):
        self.client = client
        self.map_id = map_id
        self.resources = resources
        self.limit = limit
        self.futures: list[Any] = []
        self.hint: tuple[int | None, float | None] = (None, None)  # (items left, seconds per item), from the map
        self.peak = 0  # most demand tasks kept at once (for tests and reports)

    def update(self, live: int, more_work: bool) -> int:
        """Keep as many demand tasks as the map could use threads beyond its ``live`` leases; returns that number."""
        want = 0
        if more_work and adaptive(self.client):
            remaining, per_item = self.hint
            want = wanted_threads(live, remaining, per_item, target_duration(self.client), self.limit)
        self.keep(want)
        return want

    def keep(self, n: int) -> None:
        """Keep exactly ``n`` demand tasks: submit the missing ones, release the surplus (newest first)."""
        # A reconnected client's futures were cancelled by Dask; a no-workers-timeout fails them.
        self.futures = [f for f in self.futures if f.status == "pending"]
        have = len(self.futures)
        if n > have:
            if getattr(self.client, "status", None) != "running":
                return
            keys = [f"jc-lease-{self.map_id}-want-{next(_numbers)}" for _ in range(n - have)]
            kwargs: dict[str, Any] = {"key": keys, "pure": False, "workers": [NOWHERE], "allow_other_workers": False}
            if self.resources:
                kwargs["resources"] = self.resources
            try:
                self.futures += self.client.map(_wanted, range(n - have), **kwargs)
            except Exception:  # noqa: BLE001 - a signal only: the map goes on without it
                logger.debug("submitting demand tasks failed", exc_info=True)
            self.peak = max(self.peak, len(self.futures))
        elif n < have:
            surplus, self.futures = self.futures[n:], self.futures[:n]
            for fut in surplus:
                fut.release()  # thread-safe, no round trip: the scheduler forgets a task nobody wants

    def close(self) -> None:
        """Release every demand task (the map ended, or its work ran out)."""
        if self.futures:
            self.keep(0)
