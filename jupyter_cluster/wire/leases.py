"""Lease tasks counted apart from a worker's other tasks: the sidebar's and the notebook widget's rule.

The engine's direct path runs a long task per worker thread (keys
``jc-lease-…``) that stays "executing" in Dask's accounting between maps.
Each worker reports how many of its leases are working in a custom worker
metric (:data:`BUSY_METRIC`, ``engine/worker/registry.py``); the server's
worker feed (``server/workers.py``) and the notebook's cluster widget
(``widgets/cluster.py``) both count the working ones as running tasks and the
rest as idle leases (:func:`split_leases`), so the two never disagree.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

#: the key prefix of the engine's lease tasks (``engine/direct.py`` names them ``jc-lease-<map>-<n>``)
LEASE_PREFIX = "jc-lease-"
#: the custom worker metric holding how many of a worker's leases are working (``engine.worker.registry``)
BUSY_METRIC = "jc_busy_leases"


def lease_counts(processing: Mapping[str, Iterable[Any]]) -> dict[str, int]:
    """Worker address -> number of lease tasks among the keys the scheduler has it processing."""
    return {
        addr: sum(1 for k in keys if isinstance(k, str) and k.startswith(LEASE_PREFIX))
        for addr, keys in processing.items()
    }


def busy_leases(workers: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    """Worker address -> its working leases, from the scheduler's worker table (``identity()["workers"]``).

    Each worker reports the count in its heartbeats' metrics under
    :data:`BUSY_METRIC`; a worker that reports none (no lease has run there
    yet, or an engine from before the metric) is left out.
    """
    out: dict[str, int] = {}
    for addr, w in workers.items():
        value = (w.get("metrics") or {}).get(BUSY_METRIC)
        if isinstance(value, int) and not isinstance(value, bool):
            out[addr] = value
    return out


def split_leases(
    workers: list[dict[str, Any]], leases: Mapping[str, int], busy: Mapping[str, int], jobs_running: int
) -> None:
    """Count each worker's leases apart from its tasks (in place).

    ``executing`` keeps the tasks that run work: the worker's executing count
    less its lease tasks, plus those of its leases that run a batch (``busy``,
    the worker's own :data:`BUSY_METRIC`).  ``leases`` is how many lease tasks
    it holds, ``idle_leases`` how many of them wait for a map.  A worker that
    reports no metric has its leases counted as running while a job runs on
    the cluster (``jobs_running``), as idle otherwise.
    """
    for w in workers:
        n = int(leases.get(w["address"], 0))
        others = max(0, int(w.get("executing", 0)) - n)
        known = busy.get(w["address"])
        working = min(n, max(0, known)) if known is not None else (n if jobs_running > 0 else 0)
        w["executing"] = others + working
        w["leases"] = n
        w["idle_leases"] = n - working
