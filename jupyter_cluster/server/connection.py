"""The server's connection to one cluster: its registry record, a client to its scheduler, what it heard.

One asynchronous ``distributed.Client`` per live scheduler (made on the server's
event loop) subscribes to the telemetry topics (``jupyter-cluster:jobs``, and every
``jupyter-cluster:metrics:<topic>`` through the index topic) and keeps their
history (:mod:`.jobs`, :class:`jupyter_cluster.telemetry.topic_store.TopicStore`), because
the scheduler itself keeps only a short backlog.  A lost scheduler connection is
retried with backoff (a restarted scheduler is re-subscribed); requests to the
cluster's owner go over the scheduler's control topic (:mod:`jupyter_cluster.cluster.control`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import Any

# Imported here, at server start, rather than at the first connection: importing
# distributed takes a second or more and would stall the server's event loop.
from distributed import Client

from ..cluster import control
from ..errors import ClusterError
from ..state import registry
from ..state.credentials import saved_security
from ..state.dashboard_socket import link
from ..telemetry.hub import Hub, follow
from ..telemetry.topic_names import CONTROL_TOPIC, JOBS_TOPIC
from ..telemetry.topic_store import TopicStore
from ..wire.models import ClusterDetail, ClusterSummary, cluster_detail, cluster_model, cluster_summary
from .gateway_dashboard import gateway_target
from .jobs import JobsStore
from .workers import busy_leases, lease_counts, split_leases


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

_serials = itertools.count(1)


class SchedulerLost(ClusterError):
    """The server's connection to a scheduler closed while a request waited for its answer."""


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
        await self._add_backend_view(model)  # type: ignore[arg-type]
        return cluster_detail(model, summary)

    async def _add_backend_view(self, model: dict[str, Any]) -> None:
        """What the cluster's backend shows of it (``Backend.describe``): a SLURM cluster's jobs, say."""
        from ..backends import describer

        describe = describer(self.record.backend)
        if describe is None:
            return
        assert self.client is not None  # model() checked it
        extra = self.record.extra if isinstance(self.record.extra, dict) else {}
        await describe(model, extra, self.client)


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
