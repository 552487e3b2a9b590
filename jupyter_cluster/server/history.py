"""What the server keeps of clusters: their jobs and panel-sized metrics, on disk.

When a cluster stops, its jobs and its panel-sized metrics become a
:class:`KeptCluster`, written to :class:`HistoryFolder` so that the curves
survive a server restart.  A running cluster's jobs and metrics are written
too, now and then and when the server stops (:func:`live_snapshot`, in a
folder of their own): a restarted server takes them up again
(:func:`restore_live`), or keeps them as history when the cluster stopped
meanwhile (:meth:`KeptCluster.from_live`).
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any, NoReturn

from ..errors import ClusterError
from .jobs import JobsStore, number

logger = logging.getLogger(__name__)


# -- what is kept of a stopped cluster ------------------------------------------
class KeptTopic:
    """A stopped cluster's metrics topic, as saved: the read side of a TopicStore.

    Holds the topic's panel-sized model (already downsampled), so that the
    manager's ``topics()`` and ``metrics()`` serve it like a live topic.
    """

    def __init__(self, data: dict[str, Any]):
        self.data = data
        self.topic = str(data.get("topic", ""))
        self.version = 1
        self.received = int(data.get("received") or 0)
        self.dropped = int(data.get("dropped") or 0)
        self.scalars: dict[str, Any] = data.get("scalars") or {}
        self.vectors: dict[str, Any] = data.get("vectors") or {}
        self.series = {k for by in (*self.scalars.values(), *self.vectors.values()) for k in by}

    def model(self, **_: Any) -> dict[str, Any]:
        return dict(self.data)


class KeptCluster:
    """What the server keeps of a stopped cluster: its summary, jobs and metrics.

    Serves the same reads as a live connection (``summary``, ``jobs``,
    ``metrics``) under its own key ("NAME.stopped-HHMMSS"); every action on it
    is refused with one sentence.
    """

    status = "stopped"
    client = None

    def __init__(self, key: str, summary: dict[str, Any], jobs: list[dict[str, Any]], topics: list[dict[str, Any]]):
        self.key = key
        self.name = str(summary.get("cluster") or summary.get("name") or key)
        self.stopped = number(summary.get("stopped")) or time.time()
        self._summary = summary
        self.jobs = JobsStore(keep_recent=max(20, len(jobs)))
        for job in jobs:
            self.jobs.add(job)
        self.metrics = {t.topic: t for t in (KeptTopic(d) for d in topics)}

    @classmethod
    def from_connection(cls, key: str, conn: Any, model_args: dict[str, Any]) -> KeptCluster:
        """Snapshot a connection whose cluster stopped (running jobs count as lost)."""
        jobs = []
        for j in conn.jobs.jobs.values():
            jobs.append(dict(j, state="lost") if j["state"] == "running" else dict(j))
        topics = []
        for store in conn.metrics.values():
            data = store.model(**model_args)
            data.pop("version", None)
            topics.append(data)
        summary = dict(conn.summary(), cluster=conn.name, stopped=time.time())
        return cls(key, summary, jobs, topics)

    @classmethod
    def from_live(cls, key: str, snap: dict[str, Any]) -> KeptCluster:
        """What a running cluster's :func:`live_snapshot` keeps once the cluster is gone (running jobs: lost)."""
        jobs = [dict(j, state="lost") if j.get("state") == "running" else dict(j) for j in snap.get("jobs") or []]
        topics = [dict(t["model"]) for t in snap.get("topics") or [] if isinstance(t.get("model"), dict)]
        summary = dict(snap.get("summary") or {}, cluster=str(snap["key"]), stopped=number(snap.get("saved")))
        return cls(key, summary, jobs, topics)

    def summary(self) -> dict[str, Any]:
        return dict(
            self._summary,
            name=self.key,
            cluster=self.name,
            status="stopped",
            stopped=self.stopped,
            n_workers=0,
            jobs_running=0,
            topics=sorted(self.metrics),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "format": 1,
            "key": self.key,
            "summary": self.summary(),
            "jobs": list(self.jobs.jobs.values()),
            "topics": [t.data for t in self.metrics.values()],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> KeptCluster:
        return cls(
            str(data["key"]), dict(data["summary"]), list(data.get("jobs") or []), list(data.get("topics") or [])
        )

    async def model(self) -> NoReturn:
        raise ClusterError(f"cluster {self.name!r} has stopped; its jobs and metrics are kept as {self.key!r}.")

    def refusal(self, op: str) -> ClusterError:
        """The error an action on a stopped cluster gets (the manager raises it)."""
        return ClusterError(f"cluster {self.name!r} has stopped; there is nothing to {op}.")

    async def close(self) -> None:
        return None


class HistoryFolder:
    """Kept clusters on disk, one JSON file each, the newest ``keep`` only.

    Lives in Jupyter's runtime area (``<runtime>/jupyter-cluster-history``), so
    the curves survive a server restart; a file larger than ``max_bytes`` is
    not written (the panel keeps it in memory until the server stops).
    Delete a file, or the folder, to forget; the panel's Forget does the same.
    """

    def __init__(self, folder: str | None = None, keep: int = 8, max_bytes: int = 16_000_000):
        if folder is None:
            from jupyter_core.paths import jupyter_runtime_dir

            folder = os.path.join(jupyter_runtime_dir(), "jupyter-cluster-history")
        self.folder = folder
        self.keep = keep
        self.max_bytes = max_bytes

    def _path(self, key: str) -> str:
        return os.path.join(self.folder, f"{key}.json")

    def save(self, kept: KeptCluster) -> bool:
        """Write ``kept`` (atomically); drop the oldest files beyond ``keep``. Whether it was written."""
        return self.write(kept.key, kept.to_json())

    def write(self, key: str, data: dict[str, Any]) -> bool:
        """Write ``data`` as ``key``'s file (atomically); drop the oldest beyond ``keep``. Whether it was written."""
        text = json.dumps(data, separators=(",", ":"))
        if len(text) > self.max_bytes:
            logger.warning("jupyter-cluster: the history of %s (%d bytes) is too large to keep on disk", key, len(text))
            return False
        try:
            os.makedirs(self.folder, mode=0o700, exist_ok=True)
            tmp = self._path(key) + ".tmp"
            with open(tmp, "w") as f:
                f.write(text)
            os.replace(tmp, self._path(key))
        except OSError as exc:
            logger.warning("jupyter-cluster: could not keep the history of %s: %s", key, exc)
            return False
        self._trim()
        return True

    def read_all(self) -> list[dict[str, Any]]:
        """Every file's JSON object, oldest first (unreadable files are skipped)."""
        out = []
        for path in self._files()[-self.keep :]:
            try:
                with open(path) as f:
                    data = json.load(f)
            except (OSError, ValueError) as exc:
                logger.warning("jupyter-cluster: skipping the unreadable history file %s: %s", path, exc)
                continue
            if isinstance(data, dict):
                out.append(data)
        return out

    def _files(self) -> list[str]:
        try:
            names = [n for n in os.listdir(self.folder) if n.endswith(".json")]
        except OSError:
            return []
        paths = [os.path.join(self.folder, n) for n in names]
        return sorted(paths, key=lambda p: os.path.getmtime(p))

    def _trim(self) -> None:
        files = self._files()
        for path in files[: max(0, len(files) - self.keep)]:
            try:
                os.remove(path)
            except OSError:
                pass

    def load(self) -> list[KeptCluster]:
        """The kept clusters, oldest first (unreadable files are skipped)."""
        out = []
        for path in self._files()[-self.keep :]:
            try:
                with open(path) as f:
                    out.append(KeptCluster.from_json(json.load(f)))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                logger.warning("jupyter-cluster: skipping the unreadable history file %s: %s", path, exc)
        return out

    def delete(self, key: str) -> None:
        try:
            os.remove(self._path(key))
        except FileNotFoundError:
            pass


# -- what is kept of a running cluster -----------------------------------------------
def live_snapshot(conn: Any, model_args: dict[str, Any]) -> dict[str, Any]:
    """A running cluster's jobs and metrics (bounded as for the panel) and which record they belong to."""
    r = conn.record
    return {
        "format": 1,
        "key": conn.name,
        "record": {"address": r.address, "owner_pid": r.owner_pid, "started": r.started},
        "saved": time.time(),
        "summary": conn.summary(),
        "jobs": list(conn.jobs.jobs.values()),
        "topics": [store.snapshot(**model_args) for store in list(conn.metrics.values())],
    }


def same_cluster(snap: dict[str, Any], record: Any) -> bool:
    """Whether ``snap`` was taken of the cluster ``record`` names now (not an earlier one of that name)."""
    saved = snap.get("record") or {}
    return (saved.get("address"), saved.get("owner_pid"), saved.get("started")) == (
        record.address,
        record.owner_pid,
        record.started,
    )


def restore_live(conn: Any, snap: dict[str, Any]) -> None:
    """Give a new connection the jobs and metrics a :func:`live_snapshot` of its cluster kept."""
    from ..telemetry.store import TopicStore

    for job in snap.get("jobs") or []:
        conn.jobs.add(job)
    for data in snap.get("topics") or []:
        try:
            store = TopicStore.restore(data)
        except ValueError as exc:
            logger.warning("jupyter-cluster: a kept topic of %s is unreadable: %s", conn.name, exc)
            continue
        conn.metrics.setdefault(store.topic, store)
