"""The sidebar's view of a SLURM cluster: its jobs' facts, kept in the scheduler's metadata and read back.

:class:`_Facts` polls ``squeue`` in the notebook's process and keeps what it finds under
:data:`FACTS_KEY`; the Jupyter server and the widget read it from there into a cluster
model with :func:`apply_facts`: each worker's job id, node and walltime left, and the
pending jobs with SLURM's reason.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from typing import Any

from .slurm import slurm_jobs

#: where the scheduler keeps the batch facts the sidebar shows (``Scheduler.get_metadata``)
FACTS_KEY = ["jupyter-cluster", "batch"]


class _Facts(threading.Thread):
    """Polls ``squeue`` for the cluster's jobs and keeps the facts in the scheduler's metadata."""

    def __init__(self, cluster: Any, job_name: str, interval: float):
        super().__init__(daemon=True, name="jupyter-cluster-batch-facts")
        self.cluster = cluster
        self.job_name = job_name
        self.interval = interval
        self.stopped = threading.Event()
        self.jobs: list[dict[str, Any]] = []

    def facts(self) -> dict[str, Any]:
        """Jobs as the sidebar shows them, each with its worker's name where it has one."""
        by_id = {}
        for worker_name, job in list(getattr(self.cluster, "workers", {}).items()):
            job_id = getattr(job, "job_id", None)
            if job_id:
                by_id[str(job_id)] = str(worker_name)
        jobs = [dict(j, worker=by_id.get(j["job_id"])) for j in self.jobs]
        return {"system": "slurm", "job_name": self.job_name, "updated": time.time(), "jobs": jobs}

    def publish(self) -> None:
        scheduler = getattr(self.cluster, "scheduler", None)
        if scheduler is None or not hasattr(scheduler, "set_metadata"):
            return
        facts = self.facts()
        # the scheduler lives on the cluster's event loop: its state changes there
        self.cluster.loop.add_callback(scheduler.set_metadata, keys=list(FACTS_KEY), value=facts)

    def poll(self) -> list[dict[str, Any]]:
        self.jobs = slurm_jobs(self.job_name)
        with contextlib.suppress(Exception):  # a closing cluster: nothing to tell
            self.publish()
        return self.jobs

    def run(self) -> None:
        # the first look soon (a --no-wait start's queued jobs and their reason), then every interval
        wait = min(self.interval, 1.0)
        while not self.stopped.wait(wait):
            if getattr(getattr(self.cluster, "status", None), "name", "") in ("closing", "closed"):
                return
            self.poll()
            wait = self.interval


_FACT_TEXT = re.compile(r"[A-Za-z0-9_.,:()\[\]+-]{0,200}")


def _fact(value: Any) -> str | None:
    """A text from the facts (they come over the wire): short and plain, else None."""
    return value if isinstance(value, str) and _FACT_TEXT.fullmatch(value) else None


def apply_facts(model: dict[str, Any], facts: Any) -> None:
    """Add a batch cluster's job facts to a cluster model (the panel's detail view), in place.

    Each worker row whose job is known gets ``job_id``, ``node`` and
    ``walltime_left`` (SLURM's ``[days-]hours:minutes:seconds``); the model
    gets ``batch``: ``system``, ``updated`` (when squeue was asked, epoch
    seconds), ``running`` and ``pending`` job counts, ``pending_jobs`` (each
    ``job_id``, ``reason``: SLURM's own word, e.g. ``Resources`` or
    ``PartitionTimeLimit``) and ``walltime_left`` (the shortest of the
    running jobs', or None).  ``facts`` is what :class:`_Facts` keeps in the
    scheduler's metadata; anything malformed is left out.
    """
    if not isinstance(facts, dict) or not isinstance(facts.get("jobs"), (list, tuple)):
        return
    by_worker: dict[str, dict[str, Any]] = {}
    pending = []
    running = 0
    left: list[str] = []
    for job in facts["jobs"]:
        if not isinstance(job, dict) or _fact(job.get("job_id")) is None:
            continue
        state = _fact(job.get("state")) or ""
        if state == "PENDING":
            pending.append({"job_id": job["job_id"], "reason": _fact(job.get("reason")) or ""})
            continue
        if state == "RUNNING":
            running += 1
            if _fact(job.get("walltime_left")):
                left.append(job["walltime_left"])
        worker = _fact(job.get("worker"))
        if worker:
            by_worker[worker] = job
    for row in model.get("workers", []):
        job = by_worker.get(str(row.get("name")))
        if job is not None:
            row["job_id"] = job["job_id"]
            row["node"] = _fact(job.get("node"))
            row["walltime_left"] = _fact(job.get("walltime_left"))
    updated = facts.get("updated")
    model["batch"] = {
        "system": _fact(facts.get("system")) or "",
        "updated": float(updated) if isinstance(updated, (int, float)) else None,
        "running": running,
        "pending": len(pending),
        "pending_jobs": pending,
        "walltime_left": min(left, key=_seconds) if left else None,
    }


def _seconds(walltime: str) -> int:
    """SLURM's ``[days-][[hours:]minutes:]seconds`` in seconds (for picking the shortest)."""
    days, _, rest = walltime.rpartition("-")
    total = 0
    for part in rest.split(":"):
        total = total * 60 + (int(part) if part.isdigit() else 0)
    return total + (int(days) * 86400 if days.isdigit() else 0)
