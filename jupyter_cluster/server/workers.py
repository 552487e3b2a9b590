"""The watched cluster's workers on the events socket: changes only, and none while idle.

A cluster of 256 workers is a ~45 KB list; the scheduler's heartbeats move
every worker's CPU and memory a little all the time, so pushing the list
whenever it differs would send it ~1×/s while nothing happens.  Instead the
socket sends the full list once (``cluster``), then ``workers`` messages with
the rows that changed *noticeably* since they were last sent (a dead band on
CPU and memory; any change of status, threads or tasks) and the addresses that
left.  An idle cluster sends nothing.

Lease tasks: the engine's direct path runs a long task per worker thread
(keys ``jc-lease-…``) that stays "executing" between maps.  The scheduler
cannot tell a lease that runs a batch from one that waits, so each worker
reports how many of its leases are working in a custom worker metric
(``jc_busy_leases``, sent with its heartbeats: ``engine/worker/registry.py``)
and the server counts each worker's leases apart from its other tasks, the
working ones as running and the rest as idle (:func:`split_leases`), whatever
runs elsewhere on the cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# the lease counting is shared with the notebook's cluster widget (widgets/cluster.py): it lives in wire
from ..wire.leases import BUSY_METRIC as BUSY_METRIC
from ..wire.leases import LEASE_PREFIX as LEASE_PREFIX
from ..wire.leases import busy_leases as busy_leases
from ..wire.leases import lease_counts as lease_counts
from ..wire.leases import split_leases as split_leases

#: CPU moves (percentage points) below this are not pushed
CPU_BAND = 10.0
#: memory moves below this fraction of the worker's limit (or below MEMORY_FLOOR) are not pushed
MEMORY_BAND = 0.02
MEMORY_FLOOR = 16 * 2**20

#: fields compared with a dead band; every other field (status, threads, tasks, a batch job's id…) exactly
BANDED = ("cpu", "memory")


def significant(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether ``new`` differs from the last sent ``old`` enough to be pushed."""
    if any(old.get(k) != v for k, v in new.items() if k not in BANDED) or len(old) != len(new):
        return True
    if abs(float(new.get("cpu") or 0) - float(old.get("cpu") or 0)) >= CPU_BAND:
        return True
    limit = float(new.get("memory_limit") or 0)
    band = max(MEMORY_FLOOR, MEMORY_BAND * limit)
    return abs(float(new.get("memory") or 0) - float(old.get("memory") or 0)) >= band


class WorkerFeed:
    """What one socket last sent of one cluster's workers, and the diffs to send next.

    Rows are compared with what was *sent*, not with the previous poll, so a
    slow drift is pushed once it adds up to the band.
    """

    def __init__(self) -> None:
        self.sent: dict[str, dict[str, Any]] = {}
        self.rest: dict[str, Any] | None = None

    @staticmethod
    def _rest(model: Mapping[str, Any]) -> dict[str, Any]:
        # the totals move with every heartbeat: the panel sums the workers it has instead; a batch
        # cluster's facts say when squeue was last asked, which alone is no news
        rest = {k: v for k, v in model.items() if k not in ("workers", "memory")}
        if isinstance(rest.get("batch"), dict):
            rest["batch"] = {k: v for k, v in rest["batch"].items() if k != "updated"}
        return rest

    def full(self, model: Mapping[str, Any]) -> dict[str, Any]:
        """Remember ``model`` as sent in full; the ``cluster`` message's model."""
        self.sent = {w["address"]: dict(w) for w in model["workers"]}
        self.rest = self._rest(model)
        return dict(model)

    def diff(self, model: Mapping[str, Any]) -> dict[str, Any] | None:
        """The ``workers`` message body for what changed since the last send, or None (nothing to send)."""
        changed = []
        now: dict[str, Mapping[str, Any]] = {}
        for w in model["workers"]:
            now[w["address"]] = w
            old = self.sent.get(w["address"])
            if old is None or significant(old, w):
                changed.append(dict(w))
                self.sent[w["address"]] = dict(w)
        removed = [a for a in self.sent if a not in now]
        for a in removed:
            del self.sent[a]
        rest = self._rest(model)
        summary = rest if rest != self.rest else None
        self.rest = rest
        if not changed and not removed and summary is None:
            return None
        out: dict[str, Any] = {"changed": changed, "removed": removed}
        if summary is not None:
            out["summary"] = summary
        return out
