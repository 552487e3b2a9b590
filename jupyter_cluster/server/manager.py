"""The Jupyter server's view of every cluster on the machine (no HTTP in here).

:class:`ClusterManager` reads the registry (:func:`jupyter_cluster.state.registry.live_records`)
and keeps one asynchronous ``distributed.Client`` per live scheduler.  Each
client subscribes to the telemetry topics (``jupyter-cluster:jobs``, and every
``jupyter-cluster:metrics:<topic>`` through the index topic) and keeps their
history (:mod:`.jobs`, :class:`jupyter_cluster.telemetry.topic_store.TopicStore`), because
the scheduler itself keeps only a short backlog.  A lost
scheduler connection is retried with backoff (a restarted scheduler is
re-subscribed); a record whose owner died disappears at the next refresh.

Clusters the panel starts are owned by a separate host process
(:mod:`.host`); scaling and stopping any cluster is asked of its owner over
the scheduler's control topic (:mod:`.control`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Iterable
from typing import Any

# Imported here, at server start, rather than at the first connection: importing
# distributed takes a second or more and would stall the server's event loop.
from distributed import Client

from .. import backends, config
from ..cluster import control
from ..errors import ClusterError
from ..state import registry
from ..state.credentials import saved_security
from ..state.dashboard_socket import link
from ..telemetry.hub import Hub, follow
from ..telemetry.topic_names import CONTROL_TOPIC, JOBS_TOPIC
from ..telemetry.topic_store import TopicStore
from ..tracking.runs import group_runs, merge_curves, merge_metrics
from ..tracking.runs import table as run_table
from ..wire.models import (
    ClusterDetail,
    ClusterSummary,
    TopicSummary,
    cluster_detail,
    cluster_model,
    cluster_summary,
    topic_summary,
    validate_count,
    validate_name,
)
from .gateway_dashboard import gateway_target
from .history import HistoryFolder, KeptCluster, check_live, live_snapshot, restore_live, same_cluster
from .jobs import LIST_PER_OWNER, JobsStore
from .workers import busy_leases, lease_counts, split_leases

logger = logging.getLogger(__name__)


class _QuietSchedulerLoss(logging.Filter):
    """Keep an expected event out of the server log: a cluster that stops.

    The server's client to a stopped scheduler starts reconnecting; the manager
    then closes it (the registry record went away), which cancels the reconnect,
    and distributed logs that ``CancelledError`` with a ConnectionRefusedError
    traceback (or "Failed to reconnect" had it run out first).  The panel shows
    the cluster as gone; the log needs nothing.  Only the server process imports
    this module, so kernels' own clients keep their messages.

    Any other error raised inside that reconnect is dropped too: closing the
    client while its reconnect is in a TLS handshake to the vanished scheduler
    can raise tornado's ``ValueError: IOStream is not idle``, which
    ``Client._close`` logs.  The manager reconnects by itself (``tick``) and the
    panel shows an unreachable cluster as such.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, asyncio.CancelledError) or _raised_in_reconnect(exc):
            return False
        return not record.getMessage().startswith("Failed to reconnect to scheduler")


def _raised_in_reconnect(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or an exception it chains) came out of ``Client._reconnect``."""
    seen = 0
    while exc is not None and seen < 8:
        tb = exc.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code.co_name == "_reconnect":
                return True
            tb = tb.tb_next
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


logging.getLogger("distributed.client").addFilter(_QuietSchedulerLoss())

#: downsampling of a topic for the sidebar (narrower than a notebook cell)
PANEL_MODEL = {"max_points": 4000, "max_cells": 40_000, "per_series_points": 1000}

#: seconds between writes of running clusters' jobs and metrics (only those that changed), so that
#: a server restart, or a crash, loses at most this much of them
LIVE_SAVE_INTERVAL = 10.0
#: running clusters whose jobs and metrics are kept on disk (one file each, 16 MB at most)
LIVE_KEEP = 32


_serials = itertools.count(1)


class NotFound(ClusterError):
    """No live cluster of that name."""


class SchedulerLost(ClusterError):
    """The server's connection to a scheduler closed while a request waited for its answer."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Connection:
    """One live registry record and the server's client to its scheduler."""

    def __init__(self, record: registry.ClusterRecord, base_url: str = "/"):
        self.record = record
        self.base_url = base_url
        self.name = record.name
        self.client: Client | None = None  # asynchronous (made on the server's event loop)
        self.status = "connecting"  # "running" | "unreachable" | "connecting"
        self.error: str | None = None
        self.totals: dict[str, Any] = {"n_workers": 0, "cores": 0, "memory_limit": 0}
        self.jobs = JobsStore()
        #: topic -> TopicStore, filled by a telemetry Hub; kept across reconnects
        #: so that the stores drop what a re-reached scheduler sends again
        self.metrics: dict[str, TopicStore] = {}
        self._jobs_seen: dict[str, float] = {}  # the newest job event handed on, kept across reconnects
        self._pending: dict[str, asyncio.Future] = {}
        self._next_attempt = 0.0
        self._backoff = 0.25
        self._connect_task: asyncio.Task | None = None
        self.connects = 0  # how many times a client was (re)connected
        #: tells this connection from an earlier one to a cluster of the same name (for the versions)
        self.serial = next(_serials)
        #: kernels attached to this scheduler by records of their own (hidden from the list)
        self.attached_kernels: list[str] = []
        #: the bounds its owner adapts between, as last asked through this server (None: a fixed size)
        self.adaptive: dict[str, int | None] | None = None
        #: when this server last asked for a size or bounds (0: never): an owner's newer adapt wins
        self.adaptive_at = 0.0

    # -- connection ------------------------------------------------------------
    async def tick(self) -> None:
        """Keep the client connected and the topic subscriptions current."""
        client = self.client
        if client is not None and client.status != "running":
            # A dropped scheduler connection: its own reconnect would not re-subscribe.
            await self._drop_client()
            self.status = "unreachable"
        if self.client is None:
            if time.monotonic() < self._next_attempt:
                return
            await self._connect()
            if self.client is None:
                return
        try:
            scheduler = self.client.scheduler
            assert scheduler is not None  # set when the client connected
            info = await asyncio.wait_for(scheduler.identity(n_workers=0), 5)
            self.totals = {
                "n_workers": info.get("n_workers", 0),
                "cores": info.get("total_threads", 0),
                "memory_limit": info.get("total_memory", 0),
            }
        except (OSError, asyncio.TimeoutError) as exc:
            self.error = str(exc) or type(exc).__name__
            await self._drop_client()
            self.status = "unreachable"

    async def _connect(self) -> None:
        """Connect and subscribe, in one task that whoever stops waiting for it does not cancel.

        The refresh loop's tick and a panel action (:meth:`reach`) may both want a
        client, each with a wait of its own: they share one attempt.  On a loaded
        machine the subscriptions can take longer than either wait; cancelling them
        halfway once left a client that counted as connected while its jobs
        subscription held every event back and its backlog was never read (the
        server then never listed the runs of that cluster).
        """
        task = self._connect_task
        if task is None or task.done():
            task = self._connect_task = asyncio.get_running_loop().create_task(self._connect_once())
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            # close() cancels the shared attempt when a refresh retires the connection: for a
            # waiter that was not itself cancelled (the panel's Stop in reach()), that is a
            # cluster not reached, as when the attempt fails, not an error of its own
            if not task.cancelled() or _cancelling():
                raise

    async def _connect_once(self) -> None:
        if self.client is not None:
            return
        security = None
        if self.record.address.startswith("tls://"):
            security = saved_security(self.record.name)
            if security is None:
                self.status = "unreachable"
                self.error = (
                    "TLS cluster: the server has no credentials for it; use it from the kernel that started it."
                )
                self._next_attempt = float("inf")
                return
        client = None
        try:
            client = Client(self.record.address, asynchronous=True, timeout=3, set_as_default=False, security=security)
            await client
            # Subscribe everything before the client counts as connected: a client without its
            # subscriptions would never be replaced.  A restarted scheduler's events carry newer
            # timestamps than anything kept, and a re-reached one's older events are skipped.
            client.subscribe_topic(CONTROL_TOPIC, self._on_control)
            await self._subscribe_jobs(client)
            await self._subscribe_metrics(client)
        except BaseException as exc:  # OSError, TimeoutError, a scheduler of another version; closing
            if client is not None:
                await asyncio.shield(_quietly_close(client))
            if not isinstance(exc, Exception):
                raise
            self.error = str(exc) or type(exc).__name__
            self.status = "unreachable" if self.connects or self.record.attached else "connecting"
            self._next_attempt = time.monotonic() + self._backoff
            self._backoff = min(self._backoff * 2, 5.0)
            return
        self.client = client
        self.connects += 1
        self._backoff = 0.25
        self.status = "running"
        self.error = None

    async def _drop_client(self) -> None:
        client, self.client = self.client, None
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(SchedulerLost(f"lost the connection to the scheduler of {self.name!r}."))
        self._pending.clear()
        if client is not None:
            await _quietly_close(client)

    async def close(self) -> None:
        task, self._connect_task = self._connect_task, None
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except BaseException:  # cancelled, as asked
                pass
        await self._drop_client()

    async def reach(self, timeout: float = 10.0) -> None:
        """Connect now if there is no client, without waiting out the reconnect back-off.

        For an action from the panel: the user should not get "does not
        answer" because the last attempt failed a moment ago.
        """
        if self.client is not None or self._next_attempt == float("inf"):
            return
        self._next_attempt = 0.0
        try:
            await asyncio.wait_for(self._connect(), timeout)
        except asyncio.TimeoutError:
            pass  # not reached: the caller sees no client

    async def _subscribe_jobs(self, client: Client) -> None:
        """Follow the jobs topic, replaying the scheduler's backlog once (:func:`.telemetry.hub.follow`).

        ``strict``: a backlog the scheduler does not give in time fails the connection
        (it is tried again), since job messages sent before the subscription are in it only.
        """
        await follow(client, JOBS_TOPIC, self._job_event, seen=self._jobs_seen, strict=True)

    def _job_event(self, dask_topic: str, msg: Any) -> None:
        if isinstance(msg, dict):
            self.jobs.add(dict(msg, cluster=self.name))

    async def _subscribe_metrics(self, client: Client) -> None:
        """Every metrics topic through the index topic, then each topic's backlog.

        The stores number reports per producer, so the overlap between the
        backlog and the live feed (or a second backlog after a reconnect) is
        dropped there, and only real gaps count as dropped.
        """
        await Hub(client, stores=self.metrics).follow(strict=True)

    def _on_control(self, event: tuple[float, Any]) -> None:
        msg = event[1]
        if isinstance(msg, dict) and msg.get("op") == "reply":
            req_id = msg.get("id")
            fut = self._pending.get(req_id) if isinstance(req_id, str) else None
            if fut is not None and not fut.done():
                fut.set_result(msg)

    async def request(self, op: str, timeout: float = 10.0, **args: Any) -> None:
        """Ask the cluster's owner to carry out ``op``; raise its error, or TimeoutError."""
        if self.client is None:
            raise ClusterError(f"the scheduler of {self.name!r} at {self.record.address} does not answer right now.")
        msg = control.make_request(self.name, op, **args)
        fut = asyncio.get_running_loop().create_future()
        self._pending[msg["id"]] = fut
        try:
            await self.client.log_event(CONTROL_TOPIC, msg)
            reply = await asyncio.wait_for(fut, timeout)
        finally:
            self._pending.pop(msg["id"], None)
        if not reply.get("ok"):
            raise ClusterError(reply.get("error") or f"the owner of {self.name!r} refused to {op} it.")

    # -- views -----------------------------------------------------------------
    @property
    def dashboard_link(self) -> str | None:
        """The dashboard as the browser reaches it: through this server (a private socket, a gateway's)."""
        extra = self.record.extra or {}
        if extra.get("dashboard_socket") or gateway_target(extra) is not None:
            return link(self.base_url, self.name)
        return self.record.dashboard_link

    def summary(self) -> ClusterSummary:
        summary = cluster_summary(
            self.record,
            self.dashboard_link,
            self.status,
            self.error,
            self.totals,
            sum(1 for j in self.jobs.jobs.values() if j["state"] == "running"),
            self.metrics,
            self.attached_kernels,
        )
        adaptive = self.adaptive_bounds()
        if adaptive is not None:  # the panel draws an adaptive cluster's card apart
            summary["adaptive"] = adaptive  # type: ignore[typeddict-unknown-key]
        if (self.record.extra or {}).get("kept"):  # owned by a host process (detached.host): marked kept
            summary["kept"] = True  # type: ignore[typeddict-unknown-key]
        return summary

    def adaptive_bounds(self) -> dict[str, int | None] | None:
        """The bounds the cluster adapts between, or None for a fixed size.

        The newer of what this server last asked (the panel's Adapt or Scale)
        and what the owner wrote in its registry record when it adapted
        (``%cluster adapt``, ``jc.adapt``, a handle's ``.adapt``, the panel's
        Adapt carried out: :meth:`jupyter_cluster.cluster.session.ClusterHandle.adapt`).
        """
        own = (self.record.extra or {}).get("adaptive")
        if isinstance(own, dict):
            since = own.get("since")
            bounds = {k: own.get(k) for k in ("minimum", "maximum")}
            valid = all(
                v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 0) for v in bounds.values()
            )
            if valid and isinstance(since, (int, float)) and since > self.adaptive_at:
                return bounds
        return self.adaptive

    async def model(self) -> ClusterDetail:
        """Details and workers with the summary's fields (:func:`.models.cluster_detail`).

        While the server is not connected (connecting, or the scheduler does
        not answer), the record's view as the list shows it: its status, the
        totals last seen, no worker rows (a 400 there once followed the list's
        entry for half a second).
        """
        if self.client is None:
            r = self.record
            summary = self.summary()
            detail = cluster_detail(
                cluster_model(r.name, r.backend, r.address, self.dashboard_link, not r.attached, {}), summary
            )
            for key in ("n_workers", "cores", "memory_limit"):  # the list's totals, not the empty table's
                detail[key] = summary[key]
            return detail
        scheduler = self.client.scheduler
        assert scheduler is not None  # set when the client connected
        info = await asyncio.wait_for(scheduler.identity(n_workers=-1), 10)
        r = self.record
        model = cluster_model(
            r.name, r.backend, r.address, self.dashboard_link, not r.attached, info.get("workers", {})
        )
        summary = self.summary()
        try:
            # lease tasks stay "executing" between maps: count them apart (idle unless their worker says busy)
            processing = await asyncio.wait_for(scheduler.processing(), 10)
        except (OSError, asyncio.TimeoutError, AttributeError, TypeError):
            processing = None
        if isinstance(processing, dict):
            busy = busy_leases(info.get("workers", {}))
            split_leases(model["workers"], lease_counts(processing), busy, summary["jobs_running"])  # type: ignore[arg-type]
        await self._add_batch_facts(model)  # type: ignore[arg-type]
        return cluster_detail(model, summary)

    async def _add_batch_facts(self, model: dict[str, Any]) -> None:
        """A batch (SLURM) cluster's jobs: each worker's job id, node and walltime left, pending jobs' reasons.

        Its owner keeps them in the scheduler's metadata (``backends.jobqueue``); see
        :func:`jupyter_cluster.backends.jobqueue.apply_facts` for the fields.
        """
        if not isinstance((self.record.extra or {}).get("batch"), dict):
            return
        from ..backends.jobqueue import FACTS_KEY, apply_facts

        assert self.client is not None  # model() checked it
        try:
            facts = await asyncio.wait_for(self.client.get_metadata(list(FACTS_KEY), default=None), 10)
        except (OSError, asyncio.TimeoutError, KeyError):
            return
        apply_facts(model, facts)


def _metric_names(holder: Any, runs: set[str]) -> dict[str, list[str]]:
    """Run id -> the metric names its items reported, over a cluster's topics."""
    out: dict[str, set[str]] = {}
    for store in holder.metrics.values():
        for run_id, items in store.run_items(runs).items():
            out.setdefault(run_id, set()).update(m for it in items.values() for m in it.get("final") or {})
    return {r: sorted(names) for r, names in out.items()}


def _cancelling() -> bool:
    """Whether the running task has been asked to cancel (a cancellation of its own, not of a task it awaits)."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)  # Python 3.11+; on 3.10 any cancellation counts as another's
    return bool(cancelling()) if cancelling is not None else False


async def _quietly_close(client: Client) -> None:
    try:
        await asyncio.wait_for(client.close(timeout=2), 3)
    except Exception:  # closing a client whose scheduler vanished may fail in many ways; it is gone either way
        pass


def _same_record(a: registry.ClusterRecord | None, b: registry.ClusterRecord) -> bool:
    """Whether ``a`` is the record of the same running cluster as ``b`` (its owner may have rewritten it)."""
    return a is not None and (a.address, a.owner_pid, a.started) == (b.address, b.owner_pid, b.started)


def _visible(records: list[registry.ClusterRecord]) -> dict[str, registry.ClusterRecord]:
    """One record per scheduler: a kernel that attached to a known cluster adds no row."""
    owned = {r.address for r in records if not r.attached}
    return {r.name: r for r in records if not (r.attached and r.address in owned)}


def _attached_kernels(
    records: list[registry.ClusterRecord], attachments: Iterable[registry.Attachment] = ()
) -> dict[str, list[str]]:
    """Scheduler address -> ids of the kernels attached to it (oldest first): they follow it too.

    A kernel attached by address has a record of its own; one attached by name
    has an attachment (:func:`.registry.live_attachments`), counted while the
    cluster it names still has that name and address.
    """
    live = {r.name: r.address for r in records if not r.attached}
    found = [(r.started, r.address, r.kernel_id) for r in records if r.attached and r.kernel_id]
    found += [(a.started, a.address, a.kernel_id) for a in attachments if a.kernel_id and live.get(a.name) == a.address]
    out: dict[str, list[str]] = {}
    for _, address, kernel_id in sorted(found, key=lambda f: f[0]):
        if kernel_id not in out.setdefault(address, []):
            out[address].append(kernel_id)
    return out


class ClusterManager:
    """Every live cluster on the machine, connected and observed.

    Parameters
    ----------
    interval : float
        Seconds between registry scans and scheduler polls.
    base_url : str
        The Jupyter server's base URL (dashboard links go through it).
    """

    def __init__(self, interval: float = 0.5, base_url: str = "/"):
        self.interval = interval
        self.base_url = base_url
        self.connections: dict[str, Connection] = {}
        self.version = 0  # bumped whenever the cluster list changes
        self._last_list: Any = None
        self._task: asyncio.Task | None = None
        self._hosts: dict[str, Any] = {}
        self._lock = asyncio.Lock()
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
        self._runs_cache: tuple[int, dict[str, dict[str, Any]]] | None = None
        #: final words that could not be read (skipped, with one warning each, and never read again)
        self._bad_finals: set[str] = set()
        #: final words left for a later scan, by path: the identity of the record they wait for to go
        #: (not read again while it stays: a file may hold 16 MB, and the registry is scanned twice a second)
        self._held_finals: dict[str, tuple[str, Any, Any, Any]] = {}
        #: what jobs_version() and runs_version() last saw, and the counts they return (never going down)
        self._seen: dict[str, tuple[Any, int]] = {}
        self._live_due = time.monotonic() + LIVE_SAVE_INTERVAL

    # -- lifecycle -------------------------------------------------------------
    def start(self) -> None:
        """Start refreshing in the background (on the running event loop)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        """Stop refreshing, keep the running clusters' jobs and metrics on disk, close every client."""
        self.save_live(force=True)
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None
        for conn in list(self.connections.values()):
            await conn.close()
        self.connections.clear()

    async def _run(self) -> None:
        while True:
            try:
                await self.refresh()
                if time.monotonic() >= self._live_due:
                    self._live_due = time.monotonic() + LIVE_SAVE_INTERVAL
                    await asyncio.to_thread(self._write_live, self._live_snapshots())
            except Exception:  # one bad record or scheduler must not end the refresh loop
                logger.exception("jupyter-cluster: refresh failed")
            await asyncio.sleep(self.interval)

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

    async def refresh(self) -> None:
        """Sync with the registry once and poll every scheduler."""
        async with self._lock:
            every = registry.live_records()
            records = _visible(every)
            attached = _attached_kernels(every, registry.live_attachments())
            for path, data in registry.final_words(skip=self._finals_to_skip(records)):
                self._take_final(path, data, records)  # before a stopped cluster's connection is retired
            for name in list(self.connections):
                conn = self.connections[name]
                if not _same_record(records.get(name), conn.record):
                    del self.connections[name]
                    await conn.close()
                    self._retire(conn)
            for name, rec in records.items():
                if name not in self.connections:
                    self.connections[name] = Connection(rec, self.base_url)
                    self._take_up(self.connections[name])
                else:  # the same cluster (checked above): its owner may have rewritten the record (adapt)
                    self.connections[name].record = rec
                self.connections[name].attached_kernels = attached.get(rec.address, [])
            if self._waiting is not None:
                # the first look at the registry: what is left belongs to clusters that are gone
                for snap in self._waiting.values():
                    self._keep_live(snap)
                self._waiting = None
            conns = list(self.connections.values())
            await asyncio.gather(*(self._tick(c) for c in conns))
            for c in conns:
                c.jobs.mark_lost(_pid_alive)
            listing = self.clusters()
            if listing != self._last_list:
                self._last_list = listing
                self.version += 1

    @staticmethod
    async def _tick(conn: Connection) -> None:
        try:
            await asyncio.wait_for(conn.tick(), 15)
        except Exception as exc:
            conn.error = str(exc) or type(exc).__name__
            logger.debug("jupyter-cluster: %s: %s", conn.name, conn.error)

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

    def forget(self, key: str) -> None:
        """Drop a stopped cluster's kept history."""
        if self.history.pop(key, None) is None:
            raise NotFound(f"no stopped cluster {key!r} is kept.")
        self._disk.delete(key)
        self._history_version += 1

    # -- queries ---------------------------------------------------------------
    def get(self, name: str) -> Connection | KeptCluster:
        conn = self.connections.get(name) or self.history.get(name)
        if conn is None:
            raise NotFound(f"no live cluster named {name!r}; the list shows the running ones.")
        return conn

    def live(self, name: str, op: str) -> Connection:
        """The running cluster ``name``, to ``op``; a stopped one kept for its history refuses."""
        conn = self.get(name)
        if isinstance(conn, KeptCluster):
            raise conn.refusal(op)
        return conn

    def clusters(self) -> list[ClusterSummary]:
        """Summaries of the live clusters, oldest first.

        A kernel's attachment to a scheduler that no longer answers (its owner
        stopped it) is left out: it names no cluster anyone can use.
        """
        shown = (c for c in self.connections.values() if not (c.record.attached and c.status == "unreachable"))
        return sorted((c.summary() for c in shown), key=lambda s: s["started"])

    async def cluster(self, name: str) -> ClusterDetail:
        """One cluster's details and workers."""
        return await self.get(name).model()

    # -- jobs and runs (the panel's job list, run list and sweep table) -------------------------
    def _holders(self, cluster: str | None) -> list[Connection | KeptCluster]:
        return [self.get(cluster)] if cluster else [*self.connections.values(), *self.history.values()]

    def jobs(
        self, name: str | None = None, notebook: str | None = None, kernel_id: str | None = None
    ) -> dict[str, list[dict[str, Any]]]:
        """Running and recent map jobs of one cluster, or of all of them (stopped ones too).

        ``notebook`` (its path) and ``kernel_id`` keep only that notebook's or
        kernel's jobs, every one kept; without them each notebook lists its
        newest :data:`.jobs.LIST_PER_OWNER` finished jobs, so a busy notebook
        does not push a quiet one's out.  ``history`` lists the stopped
        clusters whose jobs and metrics are kept.
        """
        running: list[dict[str, Any]] = []
        recent: list[dict[str, Any]] = []
        filtered = notebook is not None or kernel_id is not None
        for c in self._holders(name):
            snap = c.jobs.snapshot(notebook, kernel_id, per_owner=None if filtered else LIST_PER_OWNER)
            running += snap["running"]
            recent += snap["recent"]
        running.sort(key=lambda j: -j["started"])
        recent.sort(key=lambda j: -j["updated"])
        history = self.history_list()
        if notebook is not None:
            history = [h for h in history if notebook in (h.get("notebooks") or [])]
        return {"running": running, "recent": recent, "history": history}

    def runs(
        self, notebook: str | None = None, cluster: str | None = None, kernel_id: str | None = None
    ) -> list[dict[str, Any]]:
        """Run records (:func:`jupyter_cluster.tracking.runs.group_runs`, without items), newest first.

        Each has ``cluster`` (the cluster's name; for a stopped one, the key
        its history is kept under is ``history``) and ``metrics`` (the
        names its items reported).
        """
        out: list[dict[str, Any]] = []
        for holder in self._holders(cluster):
            jobs = holder.jobs.select(notebook, kernel_id)
            if not jobs:
                continue
            records = group_runs(jobs)
            names = _metric_names(holder, set(records))
            for rec in records.values():
                rec = dict(rec)
                rec.pop("items", None)
                rec["cluster"] = holder.name
                rec["history"] = holder.key if isinstance(holder, KeptCluster) else None
                rec["metrics"] = names.get(rec["run"], [])
                out.append(rec)
        out.sort(key=lambda r: -(r.get("started") or 0))
        return out

    def runs_by_id(self) -> dict[str, dict[str, Any]]:
        """Every run record (:meth:`runs`) by its id, made again only when a job changed (for the events socket)."""
        version = self.jobs_version()
        cached = self._runs_cache
        if cached is None or cached[0] != version:
            cached = self._runs_cache = (version, {r["run"]: r for r in reversed(self.runs())})
        return cached[1]

    def run(self, run_id: str) -> dict[str, Any]:
        """One run: its record with ``items``, and its sweep table ``rows`` (:func:`jupyter_cluster.tracking.runs.table`).

        Raises
        ------
        NotFound
            When no kept job belongs to a run of that id.
        """
        for holder in self._holders(None):
            jobs = [j for j in holder.jobs.jobs.values() if j.get("run") == run_id or j["job"] == run_id]
            if not jobs:
                continue
            rec = group_runs(jobs).get(run_id)
            if rec is None:
                continue
            rec = dict(rec, cluster=holder.name, history=holder.key if isinstance(holder, KeptCluster) else None)
            rows = run_table([rec], merge_metrics(holder.metrics.values(), [run_id]))
            config_keys = list(dict.fromkeys(k for r in rows for k in r["config"]))
            metric_keys = list(dict.fromkeys(k for r in rows for k in r["final"]))
            return {"run": rec, "rows": rows, "columns": {"config": config_keys, "metrics": metric_keys}}
        raise NotFound(f"no run {run_id!r} is kept; GET runs lists the runs there are.")

    def run_curves(self, run_id: str) -> dict[str, Any]:
        """One run's curves per item: ``{"run", "curves": {metric: {item key: [[step, value], ...]}}}``.

        Raises
        ------
        NotFound
            When no kept job belongs to a run of that id.
        """
        for holder in self._holders(None):
            if any(j.get("run") == run_id or j["job"] == run_id for j in holder.jobs.jobs.values()):
                return {"run": run_id, "curves": merge_curves(holder.metrics.values(), run_id)}
        raise NotFound(f"no run {run_id!r} is kept; GET runs lists the runs there are.")

    def runs_version(self) -> int:
        """Grows when a run's jobs or a running cluster's metrics change (for a cheap poll)."""
        metrics = tuple((c.serial, t, s.version) for c in self.connections.values() for t, s in c.metrics.items())
        return self._bump("runs", (self.jobs_version(), metrics))

    def jobs_version(self) -> int:
        """Grows when the jobs of a cluster or the kept history change (for a cheap poll).

        A count of the changes seen, never a sum over the live clusters: a sum
        went down (or came back to a value already sent) when a cluster
        stopped, and a change could then be skipped.
        """
        state = (tuple((c.serial, c.jobs.version) for c in self.connections.values()), self._history_version)
        return self._bump("jobs", state)

    def _bump(self, what: str, state: Any) -> int:
        last, count = self._seen.get(what, (None, 0))
        if state != last:
            count += 1
            self._seen[what] = (state, count)
        return count

    def topics(self, name: str) -> list[TopicSummary]:
        """What each of one cluster's metric topics holds (no points)."""
        conn = self.get(name)
        return [topic_summary(conn.metrics[topic]) for topic in sorted(conn.metrics)]

    def topic_version(self, name: str, topic: str) -> int | None:
        """How often a running cluster's metrics topic has changed; None when it has no such topic.

        Cheaper than :meth:`metrics` (no downsampling): the events socket asks it to
        skip the topics that have not changed since it last sent them.
        """
        conn = self.connections.get(name)
        store = conn.metrics.get(topic) if conn is not None else None
        return None if store is None else store.version

    def metrics(self, name: str, topic: str) -> dict[str, Any]:
        """A topic in the shared metrics model, downsampled for the panel, plus ``version``."""
        conn = self.get(name)
        store = conn.metrics.get(topic)
        if store is None:
            known = ", ".join(sorted(conn.metrics)) or "none yet"
            raise NotFound(f"cluster {name!r} has no metrics topic {topic!r} (topics: {known}).")
        version = store.version
        return {**store.model(**PANEL_MODEL), "version": version}

    # -- control -----------------------------------------------------------------
    def _new_name(self) -> str:
        taken = {r.name for r in registry.live_records()} | set(self.connections)
        i = 1
        while f"panel-{i}" in taken:
            i += 1
        return f"panel-{i}"

    async def start_cluster(
        self,
        name: str | None = None,
        workers: int | None = None,
        threads: int | None = None,
        memory_limit: str | None = None,
        backend: str | None = None,
        timeout: float = 180.0,
    ) -> ClusterSummary:
        """Start a cluster owned by a new host process; returns its summary."""
        name = validate_name(name) if name is not None else self._new_name()
        if registry.read(name) is not None:
            raise ClusterError(f"a cluster named {name!r} already exists; choose another name.")
        backend = backend or config.get("backend")
        if backend not in backends.available():
            raise ClusterError(
                f"unknown backend {backend!r}; choose one of: {', '.join(sorted(backends.available()))}."
            )
        if workers is not None:
            validate_count(workers, "workers")
            if workers == 0:  # the panel starts no adaptive clusters: this one would never run a task
                raise ClusterError("a cluster with 0 workers can run nothing; ask for 1 or more workers.")
        if threads is not None:
            validate_count(threads, "threads", minimum=1)
        cmd = [sys.executable, "-m", "jupyter_cluster.server.host", "--name", name, "--backend", backend]
        if workers is not None:
            cmd += ["--workers", str(workers)]
        if threads is not None:
            cmd += ["--threads", str(threads)]
        if memory_limit:
            cmd += ["--memory-limit", str(memory_limit)]
        log_path = _log_path(name)
        cmd += ["--log", log_path]
        with open(log_path, "ab") as log:  # noqa: ASYNC230 (a local file opened once per cluster start)
            proc = await asyncio.create_subprocess_exec(
                *cmd,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                start_new_session=True,  # Ctrl-C on the server must not stop the cluster
            )
        assert proc.stdout is not None  # stdout=PIPE above
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), timeout)
        except asyncio.TimeoutError:
            _kill_group(proc.pid)
            raise ClusterError(f"cluster {name!r} did not start within {timeout:g} s; see {log_path}.") from None
        try:
            answer = json.loads(line)
        except ValueError:
            code = await _exit_code(proc)
            raise ClusterError(
                f"the process starting {name!r} exited (code {code}) without starting it; see {log_path}."
            ) from None
        if not answer.get("ok"):
            await _exit_code(proc)
            raise ClusterError(answer.get("error") or f"cluster {name!r} could not start; see {log_path}.")
        self._hosts[name] = proc
        deadline = time.monotonic() + 10
        while name not in self.connections and time.monotonic() < deadline:
            await self.refresh()
            if name not in self.connections:
                await asyncio.sleep(0.05)
        conn = self.connections.get(name)
        if conn is None:
            raise ClusterError(
                f"cluster {name!r} started, but this server has not reached its scheduler yet; "
                "it will show in the list once it has."
            )
        return conn.summary()

    async def scale(self, name: str, n: int) -> None:
        validate_count(n, "workers")
        conn = self.live(name, "scale")
        await self._request(conn, "scale", n=n)
        conn.adaptive, conn.adaptive_at = None, time.time()  # a fixed size again

    async def adapt(self, name: str, minimum: int = 0, maximum: int | None = None) -> None:
        validate_count(minimum, "minimum")
        if maximum is not None:
            validate_count(maximum, "maximum")
            if maximum < minimum:
                raise ClusterError(f"maximum ({maximum}) must be at least minimum ({minimum}).")
        conn = self.live(name, "adapt")
        await self._request(conn, "adapt", minimum=minimum, maximum=maximum)
        conn.adaptive, conn.adaptive_at = {"minimum": minimum, "maximum": maximum}, time.time()

    async def _request(self, conn: Connection, op: str, **args: Any) -> None:
        try:
            await conn.request(op, **args)
        except asyncio.TimeoutError:
            raise ClusterError(
                f"the owner of {conn.name!r} ({conn.record.owner_kind} pid {conn.record.owner_pid}) did not answer; "
                f"{op} it from the process that started it."
            ) from None

    async def stop(self, name: str, timeout: float = 20.0) -> None:
        """Stop a cluster: ask its owner; failing that, end it ourselves.

        For a stopped cluster kept for its history, forget that history.
        """
        if name in self.history and name not in self.connections:
            self.forget(name)
            return
        conn = self.live(name, "stop")
        rec = conn.record
        asked = False
        await conn.reach()
        if conn.client is not None:
            try:
                await conn.request("stop", timeout=5)
                asked = True
            except SchedulerLost:
                # The owner answers, then closes its cluster: the scheduler can go down before
                # the answer reaches us.  Gone is what was asked for; its record going confirms it.
                asked = True
            except asyncio.TimeoutError:
                # the same, seen before the refresh loop noticed the lost connection
                asked = conn.client is None or conn.client.status != "running"
            except ClusterError:
                asked = False
        if not asked and self.connections.get(name) is not conn:
            # a refresh retired the connection while reach() waited: the record went (the cluster
            # stopped, or a new one has the name), which is what was asked for
            asked = True
        if not asked:
            if rec.owner_kind == "panel" and rec.owner_is_panel_host():  # never signal a process not proven ours
                os.kill(rec.owner_pid, signal.SIGTERM)
            elif conn.client is not None:
                try:
                    await asyncio.wait_for(conn.client.shutdown(), 10)
                except Exception:  # the scheduler closes the connection as it goes down
                    pass
                registry.remove(name)
            else:
                raise ClusterError(
                    f"cluster {name!r} does not answer and is not ours to end; stop it where it was started."
                )
        deadline = time.monotonic() + timeout
        while _same_record(registry.read(name), rec):  # (a new cluster of that name is not waited for)
            if time.monotonic() > deadline:
                raise ClusterError(f"cluster {name!r} was asked to stop but is still registered after {timeout:g} s.")
            await asyncio.sleep(0.1)
        proc = self._hosts.get(name)
        if proc is not None and proc.pid == rec.owner_pid:  # not the host of a new cluster of that name
            del self._hosts[name]
            await _exit_code(proc, timeout=10)
        await self.refresh()


def _live_folder() -> str:
    from jupyter_core.paths import jupyter_runtime_dir

    return os.path.join(jupyter_runtime_dir(), "jupyter-cluster-live")


def _log_path(name: str) -> str:
    from jupyter_core.paths import jupyter_runtime_dir

    folder = os.path.join(jupyter_runtime_dir(), "jupyter-cluster-logs")
    return os.path.join(registry.private_folder(folder, "the cluster log folder"), f"{name}.log")


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass


async def _exit_code(proc: Any, timeout: float = 5.0) -> int | None:
    try:
        return await asyncio.wait_for(proc.wait(), timeout)
    except asyncio.TimeoutError:
        return None
