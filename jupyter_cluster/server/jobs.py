"""Running and recent map jobs of one cluster.

Every submitting kernel publishes its jobs' progress on ``jupyter-cluster:jobs``
(see :mod:`jupyter_cluster.telemetry.progress`); the scheduler keeps only a short
backlog, so the server keeps the latest message per job here.  No Dask, no
HTTP: messages in, the panel's JSON out.  (Metrics are kept by
:class:`jupyter_cluster.telemetry.store.TopicStore`, the same class the notebook uses;
what is kept of a stopped cluster is in :mod:`.history`.)
"""

from __future__ import annotations

import math
import time
from numbers import Real
from typing import Any

from ..models import JOB_STATES, JobMessage, job_failures, job_message


def number(v: Any) -> float | None:
    """``v`` as a finite float, or None (message fields are checked, never trusted)."""
    if isinstance(v, bool) or not isinstance(v, Real):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


class JobsStore:
    """Latest progress of every map job published on ``jupyter-cluster:jobs``.

    Parameters
    ----------
    keep_recent : int
        Finished jobs kept for display.
    """

    def __init__(self, keep_recent: int = 20):
        self.keep_recent = keep_recent
        self.jobs: dict[str, JobMessage] = {}
        self.version = 0

    def add(self, msg: Any) -> bool:
        """Take one job message; returns whether it was valid."""
        if not isinstance(msg, dict) or not isinstance(msg.get("job"), str):
            return False
        state = str(msg["state"]) if msg.get("state") in JOB_STATES else "running"
        done, failed = msg.get("done"), msg.get("failed")
        if not all(isinstance(v, (int, type(None))) and not isinstance(v, bool) for v in (done, failed)):
            return False
        job = job_message(
            job=msg["job"],
            label=str(msg.get("label") or msg["job"]),
            kernel=msg.get("kernel"),
            cluster=msg.get("cluster"),
            total=msg.get("total") if isinstance(msg.get("total"), int) else None,
            done=done or 0,
            failed=failed or 0,
            state=state,
            started=number(msg.get("started")) or time.time(),
            updated=number(msg.get("updated")) or time.time(),
            failures=job_failures(msg.get("failures")),
            kernel_id=msg.get("kernel_id"),
        )
        old = self.jobs.get(job["job"])
        if old is not None and old["updated"] > job["updated"]:
            return True  # a late duplicate from the backlog
        self.jobs[job["job"]] = job
        self.version += 1
        self._trim()
        return True

    def _trim(self) -> None:
        ended = [j for j in self.jobs.values() if j["state"] != "running"]
        if len(ended) > self.keep_recent:
            ended.sort(key=lambda j: j["updated"])
            for j in ended[: len(ended) - self.keep_recent]:
                del self.jobs[j["job"]]

    def mark_lost(self, alive) -> None:
        """Mark running jobs whose submitting kernel is gone (``alive(pid) -> bool``)."""
        for j in self.jobs.values():
            if j["state"] == "running" and isinstance(j["kernel"], int) and not alive(j["kernel"]):
                j["state"] = "lost"
                self.version += 1

    def snapshot(self) -> dict[str, list[dict[str, Any]]]:
        """``{"running": [...], "recent": [...]}``, newest first."""
        running = sorted((j for j in self.jobs.values() if j["state"] == "running"), key=lambda j: -j["started"])
        recent = sorted((j for j in self.jobs.values() if j["state"] != "running"), key=lambda j: -j["updated"])
        return {"running": [dict(j) for j in running], "recent": [dict(j) for j in recent]}
