"""What the server keeps of clusters: running ones' jobs and metrics on disk, stopped ones' history.

A running cluster's jobs and metrics are written now and then (and when the server
stops) and taken up again by the connection to the same cluster after a restart
(:func:`.history.restore_live`); a stopped cluster's are kept under a key of their own
(``NAME.stopped-HHMMSS``) for the panel, on disk too (:class:`.history.HistoryFolder`).
An owner's final word (:func:`jupyter_cluster.state.registry.write_final`) adds the
messages the server's subscription missed.

:class:`ClusterHistory` is the manager's base class: the refresh loop
(:class:`.manager.ClusterManager`) retires connections into it and takes snapshots
from it, and the panel's queries read :attr:`ClusterHistory.history` beside the live
connections.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from ..state import registry
from ..telemetry.topic_store import PANEL_MODEL
from .connection import Connection
from .history import HistoryFolder, KeptCluster, check_live, live_snapshot, restore_live, same_cluster

logger = logging.getLogger(__name__)


#: seconds between writes of running clusters' jobs and metrics (only those that changed), so that
#: a server restart, or a crash, loses at most this much of them
LIVE_SAVE_INTERVAL = 10.0
#: running clusters whose jobs and metrics are kept on disk (one file each, 16 MB at most)
LIVE_KEEP = 32


class ClusterHistory:
    """The kept history of stopped clusters and the on-disk snapshots of running ones.

    Attributes
    ----------
    history : dict
        Stopped clusters' kept jobs and metrics by key, oldest first.
    connections : dict
        The live connections by cluster name (filled by the manager's refresh).
    """

    def __init__(self) -> None:
        self.connections: dict[str, Connection] = {}
        #: stopped clusters' jobs and metrics under a key of their own
        #: ("NAME.stopped-HHMMSS"), oldest first; on disk too, so a restarted server has them
        self._disk = HistoryFolder()  # bounded by bytes on disk, per notebook (jupyter-cluster.server.history-*)
        self.history: dict[str, KeptCluster] = {k.key: k for k in self._disk.load()}
        self._history_version = 0
        #: running clusters' jobs and metrics, written now and then and when the server stops; taken
        #: up again by the connection to the same cluster after a restart (:func:`.history.restore_live`)
        self._live = HistoryFolder(  # one file per running cluster: bounded by their number, not by owner
            folder=_live_folder(), keep=LIVE_KEEP, total_bytes=LIVE_KEEP << 24, owner_bytes=LIVE_KEEP << 24
        )
        self._waiting: dict[str, dict[str, Any]] | None = {
            d["key"]: d for d in self._live.read_all(check_live) if registry.valid_name(d["key"])
        }
        self._live_versions: dict[str, Any] = {}
        #: final words that could not be read (skipped, with one warning each, and never read again)
        self._bad_finals: set[str] = set()
        #: final words left for a later scan, by path: the identity of the record they wait for to go
        #: (not read again while it stays: a file may hold 16 MB, and the registry is scanned twice a second)
        self._held_finals: dict[str, tuple[str, Any, Any, Any]] = {}
        self._live_due = time.monotonic() + LIVE_SAVE_INTERVAL

    # -- running clusters' jobs and metrics on disk --------------------------------------
    def _live_snapshots(self, force: bool = False) -> list[dict[str, Any]]:
        """Snapshots of the connections whose jobs or metrics changed since they were last written."""
        out = []
        for name, conn in list(self.connections.items()):
            if not conn.jobs.jobs and not conn.metrics:
                continue
            version = (conn.jobs.version, sorted((t, s.version) for t, s in conn.metrics.items()))
            if not force and self._live_versions.get(name) == version:
                continue
            self._live_versions[name] = version
            out.append(live_snapshot(conn, PANEL_MODEL))
        return out

    def _write_live(self, snaps: list[dict[str, Any]]) -> None:
        for snap in snaps:
            self._live.write(snap["key"], snap)

    def save_live(self, force: bool = False) -> int:
        """Write the running clusters' jobs and metrics now (the server stops); how many were written."""
        snaps = self._live_snapshots(force)
        self._write_live(snaps)
        return len(snaps)

    def _take_up(self, conn: Connection) -> None:
        """Give a new connection what the last server kept of its cluster (nothing if another cluster had the name)."""
        if self._waiting is None:
            return
        snap = self._waiting.pop(conn.name, None)
        if snap is None:
            return
        if same_cluster(snap, conn.record):
            restore_live(conn, snap)
        else:
            self._keep_live(snap)

    def _keep_live(self, snap: dict[str, Any]) -> None:
        """A cluster that stopped while no server watched it: what was kept of it becomes history."""
        name = str(snap["key"])
        saved = snap.get("saved")
        try:
            when = time.localtime(saved) if isinstance(saved, (int, float)) else None
        except (OverflowError, OSError, ValueError):  # a time no clock shows (1e300, NaN)
            when = None
        try:
            kept = KeptCluster.from_live(self._history_key(name, when), snap)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            logger.warning("jupyter-cluster: the kept jobs and metrics of %s are unreadable: %s", name, exc)
        else:
            if kept.jobs.jobs or kept.metrics:
                self._keep(kept)
        self._live.delete(name)

    def _take_final(self, path: str, data: dict[str, Any], records: dict[str, registry.ClusterRecord]) -> None:
        """Take up the final word an owner left of a cluster it stopped (:func:`.registry.write_final`).

        Its jobs go into the connection to that cluster when the server follows
        it (a last message the subscription missed), else, with what the last
        server wrote of it while it ran (if anything), into a history entry of
        its own: a cluster that started, ran its maps and stopped between two
        scans is listed all the same.  Left for the next scan while the
        cluster's record is still there (and not read again until it goes); a
        damaged file is skipped with one warning, left there to look at and not
        read again (the owners' newest :data:`.registry.FINAL_KEEP` push it out).
        """
        try:
            snap = check_live(data)
            name = str(snap["key"])
            rec = records.get(name)
            if rec is not None and same_cluster(snap, rec):
                # written just before the record goes: taken up once it has gone
                self._held_finals[path] = (name, rec.address, rec.owner_pid, rec.started)
                return
            conn = self.connections.get(name)
            if conn is not None and same_cluster(snap, conn.record):
                for job in snap.get("jobs") or []:  # each an object (check_live); JobsStore.add drops a bad one
                    conn.jobs.add(dict(job, cluster=name))
                # a topic the subscription had not read yet when the cluster stopped (a short-lived
                # cluster on a loaded machine): the owner's copy; one it follows already stays
                restore_live(conn, {"topics": snap.get("topics") or []})
            else:
                waiting = (self._waiting or {}).get(name)
                if waiting is not None and waiting.get("record") == snap.get("record"):
                    del self._waiting[name]  # type: ignore[union-attr]  # (not None: it held the snapshot)
                    self._live.delete(name)
                    snap = dict(waiting, jobs=[*(waiting.get("jobs") or []), *(snap.get("jobs") or [])])
                jobs = [dict(j, cluster=name) for j in snap.get("jobs") or [] if isinstance(j, dict)]
                kept = KeptCluster.from_live(self._history_key(name), dict(snap, jobs=jobs))
                if kept.jobs.jobs or kept.metrics:
                    self._keep(kept)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:  # BadFile: not what an owner writes
            logger.warning("jupyter-cluster: skipping the unreadable final word %s: %s", path, exc)
            self._bad_finals.add(path)
            return
        registry.remove_final(path)

    def _finals_to_skip(self, records: dict[str, registry.ClusterRecord]) -> set[str]:
        """The final words not to read at this scan: damaged ones, and those whose cluster's record is still there."""
        for path, (name, *ident) in list(self._held_finals.items()):
            rec = records.get(name)
            if rec is None or [rec.address, rec.owner_pid, rec.started] != ident:
                del self._held_finals[path]  # its record went: read it again, to take it up
        # the files the registry dropped (:data:`.registry.FINAL_KEEP`) need no more remembering
        self._bad_finals = {p for p in self._bad_finals if os.path.lexists(p)}
        return self._bad_finals | set(self._held_finals)

    def _retire(self, conn: Connection) -> None:
        """Keep a stopped cluster's jobs and metrics (when it had any) for the panel."""
        self._live.delete(conn.name)
        self._live_versions.pop(conn.name, None)
        if not conn.jobs.jobs and not conn.metrics:
            return
        self._keep(KeptCluster.from_connection(self._history_key(conn.name), conn, PANEL_MODEL))

    def _history_key(self, name: str, when: time.struct_time | None = None) -> str:
        base = f"{name[:40]}.stopped-{time.strftime('%H%M%S', when or time.localtime())}"
        key, i = base, 1
        while key in self.history or key in self.connections or self._disk.has(key):
            i += 1
            key = f"{base}-{i}"
        return key

    def _keep(self, kept: KeptCluster) -> None:
        """Keep a stopped cluster (on disk too) under a title no other kept cluster has."""
        title, taken, i = kept.title(), {k.summary()["title"] for k in self.history.values()}, 1
        unique = title
        while unique in taken:
            i += 1
            unique = f"{title} ({i})"
        kept._summary["title"] = unique
        self.history[kept.key] = kept
        for key in self._disk.save(kept):  # what the size budgets gave up (never another owner's within its share)
            if key != kept.key:  # one too large for a file stays in memory until the server stops
                self.history.pop(key, None)
        self._history_version += 1

    def history_list(self) -> list[dict[str, Any]]:
        """Summaries of the stopped clusters kept for their history, newest first."""
        return [kept.summary() for kept in reversed(self.history.values())]


def _live_folder() -> str:
    from jupyter_core.paths import jupyter_runtime_dir

    return os.path.join(jupyter_runtime_dir(), "jupyter-cluster-live")
