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
import stat
import time
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from ..errors import ClusterError
from ..state.history_files import (
    checked_run_items,
    history_dir,
    history_files,
    kept_run_items,
    read_json,
    series_keys,
)
from ..state.history_files import size as _size
from ..state.registry import private_folder
from ..telemetry.topic_store import TopicStore
from .jobs import JobsStore, number

logger = logging.getLogger(__name__)

T = TypeVar("T")


# -- checking what a file holds ----------------------------------------------------------
# A file in the runtime folder may be damaged, hand-edited, or from another version: its JSON
# is checked down to the points before anything of it is used, and one that does not fit is
# skipped with a warning naming it (an AttributeError here once stopped the whole server
# extension from loading, on every start, until the file was deleted by hand).
class BadFile(ValueError):
    """What is wrong with a kept file, as ``"<where>: <what>"``."""


def _fail(where: str, what: str) -> NoReturn:
    raise BadFile(f"{where or 'the file'}: {what}")


def _type(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _obj(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        _fail(where, f"expected a JSON object, found {_type(value)}")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        _fail(where, f"expected a list, found {_type(value)}")
    return value


def _num(value: Any, where: str, none: bool = False) -> None:
    if value is None and none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _fail(where, f"expected a number, found {_type(value)}")


def _count(data: dict[str, Any], key: str, where: str) -> int:
    value = data.get(key) or 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        _fail(f"{where}/{key}", f"expected a count, found {value!r:.40}")
    return value


def _points(value: Any, where: str, none: bool) -> None:
    for i, point in enumerate(_list(value, where)):
        if not isinstance(point, list) or len(point) != 2:
            _fail(f"{where}/{i}", "expected a [step, value] pair")
        _num(point[0], f"{where}/{i}/0")
        _num(point[1], f"{where}/{i}/1", none=none)


def check_topic_model(data: Any, where: str = "topic") -> dict[str, Any]:
    """``data`` if it is a topic's chart model (:func:`jupyter_cluster.wire.models.metrics_model`), else :class:`BadFile`."""
    model = _obj(data, where)
    if not isinstance(model.get("topic"), str) or not model["topic"]:
        _fail(f"{where}/topic", "expected the topic's name")
    for name, by_series in _obj(model.get("scalars") or {}, f"{where}/scalars").items():
        for key, points in _obj(by_series, f"{where}/scalars/{name}").items():
            _points(points, f"{where}/scalars/{name}/{key}", none=True)
    for name, by_series in _obj(model.get("vectors") or {}, f"{where}/vectors").items():
        for key, vs in _obj(by_series, f"{where}/vectors/{name}").items():
            at = f"{where}/vectors/{name}/{key}"
            vs = _obj(vs, at)
            steps, rows = _list(vs.get("steps"), f"{at}/steps"), _list(vs.get("rows"), f"{at}/rows")
            if len(steps) != len(rows):
                _fail(at, f"{len(steps)} steps but {len(rows)} rows")
            for i, step in enumerate(steps):
                _num(step, f"{at}/steps/{i}")
            for i, row in enumerate(rows):
                for j, x in enumerate(_list(row, f"{at}/rows/{i}")):
                    _num(x, f"{at}/rows/{i}/{j}", none=True)
    for key, pairs in _obj(model.get("times") or {}, f"{where}/times").items():
        _points(pairs, f"{where}/times/{key}", none=False)
    for key in ("received", "dropped", "truncated"):
        _count(model, key, where)
    return model


def _check_jobs(value: Any, where: str) -> list[dict[str, Any]]:
    jobs = _list(value or [], where)
    for i, job in enumerate(jobs):
        _obj(job, f"{where}/{i}")  # the fields are checked by JobsStore.add, which drops a bad job
    return jobs


#: the summary fields the panel reads, and the JSON types each may have
_SUMMARY_TYPES: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "cluster": (str,),
    "backend": (str,),
    "address": (str,),
    "dashboard_link": (str, type(None)),
    "owner_kind": (str,),
    "owner_pid": (int, type(None)),
    "attached": (bool,),
    "started": (int, float, type(None)),
    "stopped": (int, float, type(None)),
    "error": (str, type(None)),
    "n_workers": (int,),
    "cores": (int,),
    "memory_limit": (int,),
}


def _check_summary(value: Any, where: str) -> dict[str, Any]:
    summary = _obj(value, where)
    for key, types in _SUMMARY_TYPES.items():
        if key in summary and (
            not isinstance(summary[key], types) or (isinstance(summary[key], bool) and bool not in types)
        ):
            _fail(f"{where}/{key}", f"found {_type(summary[key])}")
    return summary


def check_kept(data: Any) -> dict[str, Any]:
    """``data`` if it is a kept cluster's file (:meth:`KeptCluster.to_json`), else :class:`BadFile`."""
    data = _obj(data, "")
    if not isinstance(data.get("key"), str) or not data["key"]:
        _fail("key", "expected the kept cluster's key")
    _check_summary(data.get("summary"), "summary")
    _check_jobs(data.get("jobs"), "jobs")
    for i, topic in enumerate(_list(data.get("topics") or [], "topics")):
        check_topic_model(topic, f"topics/{i}")
    return data


def check_live(data: Any) -> dict[str, Any]:
    """``data`` if it is a running cluster's file (:func:`live_snapshot`), else :class:`BadFile`.

    Its topics' points are checked when they are taken up (:meth:`TopicStore.restore`
    refuses a damaged one, which is then left out alone).
    """
    data = _obj(data, "")
    if not isinstance(data.get("key"), str):
        _fail("key", "expected the cluster's name")
    _obj(data.get("record") or {}, "record")
    _check_summary(data.get("summary") or {}, "summary")
    _check_jobs(data.get("jobs"), "jobs")
    for i, topic in enumerate(_list(data.get("topics") or [], "topics")):
        _obj(topic, f"topics/{i}")
    _num(data.get("saved"), "saved", none=True)
    return data


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
        self.truncated = int(data.get("truncated") or 0)
        self.scalars: dict[str, Any] = data.get("scalars") or {}
        self.vectors: dict[str, Any] = data.get("vectors") or {}
        self.series = series_keys(self.scalars, self.vectors)
        self.data["runs"] = checked_run_items(data.get("runs"))

    def model(self, **_: Any) -> dict[str, Any]:
        out = dict(self.data)
        out.pop("runs", None)
        return out

    def run_items(self, runs: set[str] | None = None, curves: bool = False) -> dict[str, dict[str, dict[str, Any]]]:
        """What the topic kept of each run's items (:meth:`TopicStore.run_items`)."""
        return kept_run_items(self.data["runs"], runs, curves)  # checked when it was read (__init__)


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
        self.jobs = JobsStore(max_bytes=1 << 62, owner_bytes=1 << 62)  # bounded when written (HistoryFolder)
        for job in jobs:
            self.jobs.add(job)
        counts: dict[str, int] = {}
        for j in self.jobs.jobs.values():
            if j.get("notebook"):
                counts[j["notebook"]] = counts.get(j["notebook"], 0) + 1
        notebooks = sorted(counts, key=lambda nb: (-counts[nb], nb))  # the one that ran the most first
        #: the notebooks whose jobs it holds, the one with the most first (its budget it counts against)
        self.notebooks: list[str] = notebooks
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
            data["runs"] = store.run_items(curves=True)
            topics.append(data)
        summary = dict(conn.summary(), cluster=conn.name, stopped=time.time())
        return cls(key, summary, jobs, topics)

    @classmethod
    def from_live(cls, key: str, snap: dict[str, Any]) -> KeptCluster:
        """What a running cluster's :func:`live_snapshot` keeps once the cluster is gone (running jobs: lost)."""
        jobs = [dict(j, state="lost") if j.get("state") == "running" else dict(j) for j in snap.get("jobs") or []]
        topics = [
            dict(check_topic_model(t.get("model"), f"topics/{i}/model"), runs=t.get("runs") or {})
            for i, t in enumerate(snap.get("topics") or [])
        ]
        summary = dict(snap.get("summary") or {}, cluster=str(snap["key"]), stopped=number(snap.get("saved")))
        return cls(key, summary, jobs, topics)

    @property
    def owner(self) -> str:
        """Whose history budget it counts against: its first notebook, else its cluster's owner."""
        if self.notebooks:
            return f"notebook:{self.notebooks[0]}"
        s = self._summary
        return f"{s.get('owner_kind') or 'owner'}:{s.get('owner_pid')}"

    def title(self) -> str:
        """What the panel calls it: ``"local-1 · 02-sweep.ipynb · Dec 02 14:05:09"`` (made unique by the manager)."""
        when = time.strftime("%b %d %H:%M:%S", time.localtime(self.stopped))
        parts = [self.name] + [os.path.basename(self.notebooks[0])] if self.notebooks else [self.name]
        if len(self.notebooks) > 1:
            parts[-1] += f" +{len(self.notebooks) - 1}"
        return " · ".join(parts + [when])

    def summary(self) -> dict[str, Any]:
        return dict(
            self._summary,
            name=self.key,
            cluster=self.name,
            title=str(self._summary.get("title") or self.title()),
            notebooks=list(self.notebooks),
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
            "owner": self.owner,
            "summary": self.summary(),
            "jobs": list(self.jobs.jobs.values()),
            "topics": [t.data for t in self.metrics.values()],
        }

    @classmethod
    def from_json(cls, data: Any) -> KeptCluster:
        """A kept cluster from its file's JSON.

        Raises
        ------
        BadFile
            When ``data`` is not what :meth:`to_json` writes (a damaged file).
        """
        data = check_kept(data)
        return cls(data["key"], dict(data["summary"]), list(data.get("jobs") or []), list(data.get("topics") or []))

    async def model(self) -> NoReturn:
        raise ClusterError(f"cluster {self.name!r} has stopped; its jobs and metrics are kept as {self.key!r}.")

    def refusal(self, op: str) -> ClusterError:
        """The error an action on a stopped cluster gets (the manager raises it)."""
        return ClusterError(f"cluster {self.name!r} has stopped; there is nothing to {op}.")

    async def close(self) -> None:
        return None


#: default budgets of the history folder (bytes on disk): in all, and per notebook (or cluster owner)
HISTORY_BYTES = 128_000_000
HISTORY_OWNER_BYTES = 32_000_000


def _history_setting(key: str, default: int) -> int:
    from .. import config

    value = config.get(f"server.{key}")
    return default if value is None else int(value)


class HistoryFolder:
    """Kept clusters on disk, one JSON file each, bounded by size.

    Lives in Jupyter's runtime area (``<runtime>/jupyter-cluster-history``), so
    the curves survive a server restart; a file larger than ``max_bytes`` is
    not written (the panel keeps it in memory until the server stops).  The
    files of one *owner* (the notebook whose jobs a kept cluster holds, else
    the process that owned the cluster) share ``owner_bytes``; when all of them
    pass ``total_bytes``, the owner using the most loses its oldest file.  So
    another notebook's or user's clusters never push out a notebook's history
    while it stays within its share.  ``keep`` (optional) also bounds the
    number of files (the running clusters' folder: one per cluster name).
    Delete a file, or the folder, to forget; the panel's Forget does the same.
    """

    def __init__(
        self,
        folder: str | None = None,
        keep: int | None = None,
        max_bytes: int = 16_000_000,
        total_bytes: int | None = None,
        owner_bytes: int | None = None,
    ):
        if folder is None:
            folder = history_dir()
        self.folder = folder
        self.keep = keep
        self.max_bytes = max_bytes
        self.total_bytes = total_bytes if total_bytes is not None else _history_setting("history-bytes", HISTORY_BYTES)
        self.owner_bytes = (
            owner_bytes if owner_bytes is not None else _history_setting("history-owner-bytes", HISTORY_OWNER_BYTES)
        )
        #: key -> owner of the files read (and accepted) or written by this process: those the budgets may delete
        self._owners: dict[str, str] = {}
        #: path -> (inode, size, mtime) of each file refused: kept to look at, never counted or deleted
        self._refused: dict[str, tuple[int, int, int]] = {}
        #: what a file is checked with before it counts (``read_all`` sets the caller's)
        self._check: Callable[[Any], Any] = _any_json

    def _path(self, key: str) -> str:
        return os.path.join(self.folder, f"{key}.json")

    def has(self, key: str) -> bool:
        """Whether a file of that key is on disk."""
        return os.path.exists(self._path(key))

    def save(self, kept: KeptCluster) -> list[str]:
        """Write ``kept`` (atomically) and trim to the budgets; the keys whose files were removed.

        ``kept.key`` is among them when it could not be written (too large) or
        was the one given up.
        """
        return self.write(kept.key, kept.to_json(), owner=kept.owner)

    def write(self, key: str, data: dict[str, Any], owner: str | None = None) -> list[str]:
        """Write ``data`` as ``key``'s file (atomically), trim to the budgets; the keys removed (``key`` if not written)."""
        text = json.dumps(data, separators=(",", ":"))
        if len(text) > self.max_bytes:
            logger.warning("jupyter-cluster: the history of %s (%d bytes) is too large to keep on disk", key, len(text))
            return [key]
        try:
            private_folder(self.folder, "the jupyter-cluster history folder")  # an older or hand-made one: 0700
            tmp = self._path(key) + ".tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # jobs and curves are the user's alone
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(tmp, self._path(key))
        except (OSError, ClusterError) as exc:
            logger.warning("jupyter-cluster: could not keep the history of %s: %s", key, exc)
            return [key]
        self._owners[key] = owner if owner is not None else "?"
        self._refused.pop(self._path(key), None)
        return self._trim()

    def read_all(self, check: Callable[[Any], T]) -> list[T]:
        """Every file's JSON as ``check`` returns it, oldest first.

        Only this user's regular files of mode 0600 (as :meth:`write` makes
        them) of at most ``max_bytes`` are read, as the kernel's
        :func:`jupyter_cluster.tracking.kept.kept_runs` reads them: another's file, a
        link, or one that others could have written is not taken for the
        user's history.  A file refused, not JSON, or that ``check`` refuses
        (:class:`BadFile`) is skipped with one warning naming it, and is never
        counted against the budgets nor deleted by them (it is kept to look
        at); a link, FIFO or folder named ``*.json`` is not opened at all.
        ``check`` is also what later trims read a file written meanwhile by another server with.
        """
        self._check = check
        out: list[T] = []
        others: list[str] = []
        files = history_files(self.folder, others)
        for path in others:
            logger.warning("jupyter-cluster: %s is not a regular file; the history folder leaves it alone", path)
        # newest first, so that damaged files do not take the places of the ``keep`` good ones
        for path in reversed(files):
            if self.keep is not None and len(out) == self.keep:
                break
            data = self._read(path, check)
            if data is not None:
                out.append(data)
        return out[::-1]

    def _read(self, path: str, check: Callable[[Any], T]) -> T | None:
        """``check`` of the file's JSON, learning its owner; None (one warning, remembered) when refused."""
        key = os.path.basename(path)[: -len(".json")]
        try:
            data = read_json(path, self.max_bytes, private=True)
            checked = check(data)
        except (OSError, ValueError, RecursionError) as exc:  # BadFile, JSONDecodeError, UnicodeError
            logger.warning("jupyter-cluster: skipping the unreadable history file %s: %s", path, exc)
            self._owners.pop(key, None)
            self._refused[path] = _signature(path)
            return None
        owner = data.get("owner") if isinstance(data, dict) else None
        self._owners[key] = owner if isinstance(owner, str) else "?"
        self._refused.pop(path, None)
        return checked

    def _files(self) -> list[str]:
        return history_files(self.folder)

    def _deletable(self) -> list[tuple[str, str, int]]:
        """(path, owner, size) of the files the budgets may delete, oldest first.

        Those this process wrote or read and accepted; a file another process
        wrote meanwhile is read now (once).  Files refused (another user's, open
        to others, too large, damaged) are neither counted nor deleted.
        """
        out = []
        for path in self._files():
            key = os.path.basename(path)[: -len(".json")]
            if key not in self._owners:
                if path in self._refused and self._refused[path] == _signature(path):
                    continue  # refused before and unchanged: not read again at every trim
                if self._read(path, self._check) is None:
                    continue
            out.append((path, self._owners[key], _size(path)))
        return out

    def usage(self) -> dict[str, int]:
        """Bytes on disk per owner, of the files the budgets count (see :meth:`_deletable`)."""
        out: dict[str, int] = {}
        for _, owner, size in self._deletable():
            out[owner] = out.get(owner, 0) + size
        return out

    def _trim(self) -> list[str]:
        files = self._deletable()  # oldest first
        removed: list[str] = []
        if self.keep is not None:
            for path, _, _ in files[: max(0, len(files) - self.keep)]:
                removed.append(self._remove(path))
            files = files[max(0, len(files) - self.keep) :]
        by_owner: dict[str, list[tuple[str, int]]] = {}
        for path, owner, size in files:
            by_owner.setdefault(owner, []).append((path, size))
        used = {o: sum(size for _, size in fs) for o, fs in by_owner.items()}
        for owner, fs in by_owner.items():  # each owner within its share (its newest file always stays)
            while used[owner] > self.owner_bytes and len(fs) > 1:
                path, size = fs.pop(0)
                removed.append(self._remove(path))
                used[owner] -= size
        while sum(used.values()) > self.total_bytes:  # over in all: the owner using the most gives up its oldest
            biggest = max((o for o in by_owner if len(by_owner[o]) > 1), key=lambda o: used[o], default=None)
            if biggest is None:
                break
            path, size = by_owner[biggest].pop(0)
            removed.append(self._remove(path))
            used[biggest] -= size
        return removed

    def _remove(self, path: str) -> str:
        key = os.path.basename(path)[: -len(".json")]
        try:
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid():  # not what was swapped in meanwhile
                os.remove(path)
        except OSError:
            pass
        self._owners.pop(key, None)
        return key

    def load(self) -> list[KeptCluster]:
        """The kept clusters, oldest first (a damaged file is skipped with a warning naming it)."""
        return self.read_all(KeptCluster.from_json)

    def delete(self, key: str) -> None:
        try:
            os.remove(self._path(key))
        except FileNotFoundError:
            pass
        self._owners.pop(key, None)


def _any_json(data: Any) -> Any:
    return data


def _signature(path: str) -> tuple[int, int, int]:
    """What tells a file changed since it was refused (a damaged file is not read again at every trim)."""
    try:
        st = os.lstat(path)
    except OSError:
        return (0, 0, 0)
    return (st.st_ino, st.st_size, st.st_mtime_ns)


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
    for job in snap.get("jobs") or []:
        conn.jobs.add(job)
    for data in snap.get("topics") or []:
        try:
            store = TopicStore.restore(data)
        except ValueError as exc:
            logger.warning("jupyter-cluster: a kept topic of %s is unreadable: %s", conn.name, exc)
            continue
        conn.metrics.setdefault(store.topic, store)
