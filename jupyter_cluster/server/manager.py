"""The Jupyter server's view of every cluster on the machine (no HTTP in here).

:class:`ClusterManager` reads the registry (:func:`jupyter_cluster.state.registry.live_records`)
and keeps one :class:`.connection.Connection` per live scheduler; a record whose owner
died disappears at the next refresh, its jobs and metrics kept (:mod:`.snapshots`).
It answers the panel's queries (clusters, jobs, runs, metrics) and actions.

Clusters the panel starts are owned by a separate host process
(:mod:`.host`); scaling and stopping any cluster is asked of its owner over
the scheduler's control topic (:mod:`jupyter_cluster.cluster.control`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Iterable
from typing import Any

from .. import backends, config
from ..errors import ClusterError
from ..state import registry
from ..telemetry.topic_store import PANEL_MODEL
from ..tracking.table import group_runs, merge_curves, merge_metrics
from ..tracking.table import table as run_table
from ..wire.models import ClusterDetail, ClusterSummary, TopicSummary, topic_summary, validate_count, validate_name
from .connection import Connection, SchedulerLost
from .history import KeptCluster
from .jobs import LIST_PER_OWNER
from .snapshots import LIVE_SAVE_INTERVAL, ClusterHistory

logger = logging.getLogger(__name__)


class NotFound(ClusterError):
    """No live cluster of that name."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _metric_names(holder: Any, runs: set[str]) -> dict[str, list[str]]:
    """Run id -> the metric names its items reported, over a cluster's topics."""
    out: dict[str, set[str]] = {}
    for store in holder.metrics.values():
        for run_id, items in store.run_items(runs).items():
            out.setdefault(run_id, set()).update(m for it in items.values() for m in it.get("final") or {})
    return {r: sorted(names) for r, names in out.items()}


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


class ClusterManager(ClusterHistory):
    """Every live cluster on the machine, connected and observed.

    Parameters
    ----------
    interval : float
        Seconds between registry scans and scheduler polls.
    base_url : str
        The Jupyter server's base URL (dashboard links go through it).
    poll_timeout : float
        Seconds a scan waits for one scheduler's poll (a connect attempt to a scheduler that
        accepts and never answers goes on in the background; the next scan waits for it again).
    """

    def __init__(self, interval: float = 0.5, base_url: str = "/", poll_timeout: float = 15.0):
        super().__init__()
        self.interval = interval
        self.poll_timeout = poll_timeout
        self.base_url = base_url
        self.version = 0  # bumped whenever the cluster list changes
        self._last_list: Any = None
        self._task: asyncio.Task | None = None
        self._hosts: dict[str, Any] = {}
        self._lock = asyncio.Lock()
        self._runs_cache: tuple[int, dict[str, dict[str, Any]]] | None = None
        #: what jobs_version() and runs_version() last saw, and the counts they return (never going down)
        self._seen: dict[str, tuple[Any, int]] = {}

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
            await asyncio.gather(*(self._tick(c, self.poll_timeout) for c in conns))
            for c in conns:
                c.jobs.mark_lost(_pid_alive)
            listing = self.clusters()
            if listing != self._last_list:
                self._last_list = listing
                self.version += 1

    @staticmethod
    async def _tick(conn: Connection, timeout: float) -> None:
        try:
            await asyncio.wait_for(conn.tick(), timeout)
        except Exception as exc:
            conn.error = str(exc) or type(exc).__name__
            logger.debug("jupyter-cluster: %s: %s", conn.name, conn.error)

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
        """Run records (:func:`jupyter_cluster.tracking.table.group_runs`, without items), newest first.

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
        """One run: its record with ``items``, and its sweep table ``rows`` (:func:`jupyter_cluster.tracking.table.table`).

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
