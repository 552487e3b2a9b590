"""Running and recent map jobs of one cluster, kept per notebook within a size budget.

Every submitting kernel publishes its jobs' progress on ``jupyter-cluster:jobs``
(see :mod:`jupyter_cluster.tracking.progress`); the scheduler keeps only a short
backlog, so the server keeps the latest message per job here.  No Dask, no
HTTP: messages in, the panel's JSON out.  (Metrics are kept by
:class:`jupyter_cluster.telemetry.topic_store.TopicStore`, the same class the notebook uses;
what is kept of a stopped cluster is in :mod:`.history`.)

Finished jobs are bounded by their size (JSON bytes), not by a count: each
*owner* (the notebook that ran them, else its kernel) has a budget of its own
(``jupyter-cluster.server.jobs-owner-bytes``), and when the store's total
(``jupyter-cluster.server.jobs-bytes``) is over, the owner using the most gives
up its oldest job first.  A notebook that floods the cluster with maps so
evicts only its own jobs; a quiet notebook's failed job stays.
"""

from __future__ import annotations

import json
import math
import os
import time
from numbers import Real
from typing import Any

from .. import config
from ..telemetry.tags import MAX_CONFIG_KEYS
from ..tracking.table import RUN_KINDS, group_runs
from ..tracking.tags import MAX_ITEMS
from ..wire.models import JOB_STATES, job_failures, job_message
from .renames import current_notebook

#: default budgets of finished jobs (JSON bytes): the whole store, and each notebook (or kernel) in it
JOBS_BYTES = 16_000_000
OWNER_BYTES = 4_000_000
#: finished jobs of each owner the default job list carries (the REST ``jobs?notebook=`` gives all)
LIST_PER_OWNER = 50


def number(v: Any) -> float | None:
    """``v`` as a finite float, or None (message fields are checked, never trusted)."""
    if isinstance(v, bool) or not isinstance(v, Real):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def _scalar(v: Any) -> Any:
    """A config value from the wire: a number, bool, None or (clipped) string; anything else is dropped."""
    if v is None or isinstance(v, (bool, str)):
        return v[:200] if isinstance(v, str) else v
    return number(v) if isinstance(v, Real) else _DROP


_DROP = object()


def _config(raw: Any, limit: int = MAX_CONFIG_KEYS) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(raw, dict):
        for k, v in list(raw.items())[:limit]:
            v = _scalar(v)
            if isinstance(k, str) and k and len(k) <= 200 and v is not _DROP:
                out[k] = v
    return out


def _text(v: Any, limit: int) -> str | None:
    return v[:limit] if isinstance(v, str) and v else None


def _count(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def run_fields(msg: dict[str, Any]) -> dict[str, Any]:
    """The run fields of a job message (:mod:`jupyter_cluster.tracking.runs`), checked; what does not fit is left out."""
    out: dict[str, Any] = {}
    run = _text(msg.get("run"), 64)
    if run:
        out["run"] = run
    if msg.get("kind") in RUN_KINDS:
        out["kind"] = msg["kind"]
    # a renamed notebook's kernel still names its old path: the server knows the new one (.renames)
    out["notebook"] = current_notebook(notebook_name(_text(msg.get("notebook"), 1000)), msg.get("kernel_id"))
    cell = msg.get("cell")
    if isinstance(cell, dict):
        out["cell"] = {
            "execution_count": _count(cell.get("execution_count")),
            "cell_id": _text(cell.get("cell_id"), 128),
            "first_line": _text(cell.get("first_line"), 200) or "",
        }
    else:
        out["cell"] = None
    out["config"] = _config(msg.get("config"))
    out["context"] = _config(msg.get("context"), 16)
    if isinstance(msg.get("name"), str):
        out["name"] = msg["name"][:200]
    ended = number(msg.get("ended"))
    if ended is not None:
        out["ended"] = ended
    raw_items = msg.get("items")
    if isinstance(raw_items, (list, tuple)):
        items = []
        for it in list(raw_items)[:MAX_ITEMS]:
            if not isinstance(it, dict) or _count(it.get("index")) is None:
                continue
            items.append(
                {
                    "index": it["index"],
                    "key": _text(it.get("key"), 256) or "",
                    "config": _config(it.get("config")),
                    "state": it.get("state") if it.get("state") in JOB_STATES else "finished",
                    "duration": number(it.get("duration")),
                }
            )
        out["items"] = items
    if _count(msg.get("item_count")) is not None:
        out["item_count"] = msg["item_count"]
    return out


_root_dir: str | None = None


def set_root_dir(root: str | None) -> None:
    """The Jupyter server's root directory: notebook paths under it are kept relative to it, as the browser names them."""
    global _root_dir
    _root_dir = os.path.realpath(root) if isinstance(root, str) and root else None


def notebook_name(path: str | None) -> str | None:
    """A notebook's path as the browser's session names it: relative to the server's root where it is below it.

    A kernel started by the server knows its notebook by ``JPY_SESSION_NAME``,
    which newer servers set to the absolute path.
    """
    if not path or _root_dir is None or not os.path.isabs(path):
        return path
    real = os.path.realpath(path)
    if real.startswith(_root_dir + os.sep):
        return os.path.relpath(real, _root_dir).replace(os.sep, "/")
    return path


def job_name(job: dict[str, Any]) -> str:
    """What the panel calls a job: ``"02-es.ipynb · In [5] · evaluate #3"`` (its notebook, cell, label, number in its run)."""
    parts = []
    if job.get("notebook"):
        parts.append(os.path.basename(str(job["notebook"])))
    cell = job.get("cell") or {}
    if cell.get("execution_count") is not None:
        parts.append(f"In [{cell['execution_count']}]")
    label = str(job.get("label") or job["job"])
    number = (job.get("context") or {}).get("job")
    if isinstance(number, int) and number > 1:
        label += f" #{number}"
    return " · ".join(parts + [label])


def owner_of(job: dict[str, Any]) -> str:
    """Whose budget a job counts against: its notebook, else its kernel (id, else pid), else its cluster."""
    if job.get("notebook"):
        return f"notebook:{job['notebook']}"
    if job.get("kernel_id"):
        return f"kernel:{job['kernel_id']}"
    if job.get("kernel") is not None:
        return f"pid:{job['kernel']}"
    return f"cluster:{job.get('cluster')}"


def listed(job: dict[str, Any]) -> dict[str, Any]:
    """A job as the job list shows it: without its items (``GET runs/<id>`` has them)."""
    out = dict(job)
    out.pop("items", None)
    return out


def _setting(key: str, default: int) -> int:
    value = config.get(f"server.{key}")
    return default if value is None else int(value)


class JobsStore:
    """Latest progress of every map job published on ``jupyter-cluster:jobs``, per owner within a byte budget.

    Parameters
    ----------
    max_bytes : int, optional
        JSON bytes of finished jobs kept in all (``jupyter-cluster.server.jobs-bytes``, 16 MB).
    owner_bytes : int, optional
        JSON bytes of finished jobs kept per notebook or kernel
        (``jupyter-cluster.server.jobs-owner-bytes``, 4 MB).
    """

    def __init__(self, max_bytes: int | None = None, owner_bytes: int | None = None):
        self.max_bytes = max_bytes if max_bytes is not None else _setting("jobs-bytes", JOBS_BYTES)
        self.owner_bytes = owner_bytes if owner_bytes is not None else _setting("jobs-owner-bytes", OWNER_BYTES)
        self.jobs: dict[str, dict[str, Any]] = {}
        self._size: dict[str, int] = {}
        self.version = 0
        #: finished jobs dropped to the budgets, per owner (for the log and tests)
        self.evicted: dict[str, int] = {}

    def add(self, msg: Any) -> bool:
        """Take one job message; returns whether it was valid."""
        if not isinstance(msg, dict) or not isinstance(msg.get("job"), str):
            return False
        state = str(msg["state"]) if msg.get("state") in JOB_STATES else "running"
        done, failed = msg.get("done"), msg.get("failed")
        if not all(isinstance(v, (int, type(None))) and not isinstance(v, bool) for v in (done, failed)):
            return False
        job: dict[str, Any] = dict(
            job_message(
                job=msg["job"][:64],
                label=str(msg.get("label") or msg["job"])[:200],
                kernel=msg.get("kernel") if isinstance(msg.get("kernel"), int) else None,
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
        )
        job.update(run_fields(msg))
        job["duration"] = max(0.0, job["updated"] - job["started"])  # so far, while it runs
        if not job.get("name"):
            job["name"] = job_name(job)
        old = self.jobs.get(job["job"])
        if old is not None and old["updated"] > job["updated"]:
            return True  # a late duplicate from the backlog
        if old is not None and "items" not in job and "items" in old:
            job["items"] = old["items"]
        self.jobs[job["job"]] = job
        self._size[job["job"]] = len(json.dumps(job, separators=(",", ":"), default=str))
        self.version += 1
        if job["state"] != "running":  # only finished jobs count against the budgets
            self._trim()
        return True

    def _trim(self) -> None:
        ended = [j for j in self.jobs.values() if j["state"] != "running"]
        used: dict[str, int] = {}
        for j in ended:
            used[owner_of(j)] = used.get(owner_of(j), 0) + self._size.get(j["job"], 0)
        total = sum(used.values())
        if total <= self.max_bytes and all(u <= self.owner_bytes for u in used.values()):
            return
        ended.sort(key=lambda j: j["updated"])
        by_owner: dict[str, list[dict[str, Any]]] = {}
        for j in ended:
            by_owner.setdefault(owner_of(j), []).append(j)
        for owner, jobs in by_owner.items():  # each owner within its own budget (its newest job always stays)
            while used[owner] > self.owner_bytes and len(jobs) > 1:
                total -= self._drop(jobs.pop(0), owner, used)
        while total > self.max_bytes:  # over in all: the owner using the most gives up its oldest
            biggest = max((o for o in by_owner if len(by_owner[o]) > 1), key=lambda o: used[o], default=None)
            if biggest is None:
                break
            total -= self._drop(by_owner[biggest].pop(0), biggest, used)

    def _drop(self, job: dict[str, Any], owner: str, used: dict[str, int]) -> int:
        size = self._size.pop(job["job"], 0)
        del self.jobs[job["job"]]
        used[owner] -= size
        self.evicted[owner] = self.evicted.get(owner, 0) + 1
        return size

    @property
    def nbytes(self) -> int:
        """JSON bytes of the jobs kept (running ones too)."""
        return sum(self._size.values())

    def mark_lost(self, alive) -> None:
        """Mark running jobs whose submitting kernel is gone (``alive(pid) -> bool``)."""
        for j in self.jobs.values():
            if j["state"] == "running" and isinstance(j["kernel"], int) and not alive(j["kernel"]):
                j["state"] = "lost"
                self.version += 1

    def select(self, notebook: str | None = None, kernel_id: str | None = None) -> list[dict[str, Any]]:
        """The jobs of one notebook (its path) and/or kernel (its id); all of them with neither."""
        return [
            j
            for j in self.jobs.values()
            if (notebook is None or j.get("notebook") == notebook)
            and (kernel_id is None or j.get("kernel_id") == kernel_id)
        ]

    def snapshot(
        self, notebook: str | None = None, kernel_id: str | None = None, per_owner: int | None = None
    ) -> dict[str, list[dict[str, Any]]]:
        """``{"running": [...], "recent": [...]}``, newest first, without the items of sweeps.

        ``per_owner`` limits the finished jobs listed of each notebook (or
        kernel) to its newest ones, so one notebook's many maps do not push
        another's out of the list.
        """
        chosen = self.select(notebook, kernel_id)
        running = sorted((j for j in chosen if j["state"] == "running"), key=lambda j: -j["started"])
        recent = sorted((j for j in chosen if j["state"] != "running"), key=lambda j: -j["updated"])
        if per_owner is not None:
            seen: dict[str, int] = {}
            kept = []
            for j in recent:
                o = owner_of(j)
                seen[o] = seen.get(o, 0) + 1
                if seen[o] <= per_owner:
                    kept.append(j)
            recent = kept
        return {"running": [listed(j) for j in running], "recent": [listed(j) for j in recent]}

    def runs(self) -> dict[str, dict[str, Any]]:
        """The jobs grouped into run records (:func:`jupyter_cluster.tracking.runs.group_runs`)."""
        return group_runs(self.jobs.values())
