"""The envelopes of the panel's events websocket and the ops of a cluster's control topic, as typed dicts.

The events websocket (``server/handlers.py`` ``EventsSocket``) pushes one JSON
message per change, each an envelope ``{"type": ..., ...}``; the panel sends
``watch`` and ``interval`` messages back.  ``labextension/src/model.ts``
(``ServerMessage``) and ``panel/events.ts`` (``ClientMessage``) are the other
side: ``tests/wire/test_models.py`` writes one envelope of each type, built
here, into ``labextension/src/__tests__/fixtures/wire.json``, which
``contract.spec.ts`` type-checks and feeds to the panel, so a field renamed on
one side fails a test.

The control topic (:mod:`jupyter_cluster.cluster.control`) carries requests
to a cluster's owner and its replies, on the scheduler's event log.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypedDict, get_args, get_type_hints

from .models import ClusterSummary, JobMessage, TopicSummary

# -- server -> panel ---------------------------------------------------------------------------


class ClustersMessage(TypedDict):
    """Every live cluster (and kept ones), as ``GET clusters`` lists them."""

    type: Literal["clusters"]
    clusters: list[ClusterSummary]


class _JobsMessage(TypedDict):
    type: Literal["jobs"]
    running: list[JobMessage]
    recent: list[JobMessage]


class JobsMessage(_JobsMessage, total=False):
    """The map jobs, running and recent, and the stopped clusters whose jobs and metrics are kept."""

    history: list[dict[str, Any]]


class ClusterMessage(TypedDict):
    """The watched cluster with its workers (once per watch)."""

    type: Literal["cluster"]
    name: str
    model: dict[str, Any]


class _WorkersMessage(TypedDict):
    type: Literal["workers"]
    name: str
    changed: list[dict[str, Any]]
    removed: list[str]


class WorkersMessage(_WorkersMessage, total=False):
    """The watched cluster's workers that changed noticeably, and those gone; ``summary`` when its totals did."""

    summary: dict[str, Any]


class TopicsMessage(TypedDict):
    """The watched cluster's metric topics."""

    type: Literal["topics"]
    cluster: str
    topics: list[TopicSummary]


class MetricsMessage(TypedDict):
    """A watched topic's metrics model, when it changed."""

    type: Literal["metrics"]
    cluster: str
    topic: str
    data: dict[str, Any]


class RunMessage(TypedDict):
    """A run the socket had not listed ("added"), or a listed running run that ended ("finished")."""

    type: Literal["run"]
    event: Literal["added", "finished"]
    run: dict[str, Any]


class ErrorMessage(TypedDict):
    """What was wrong with the panel's last message."""

    type: Literal["error"]
    message: str


ServerMessage = (
    ClustersMessage
    | JobsMessage
    | ClusterMessage
    | WorkersMessage
    | TopicsMessage
    | MetricsMessage
    | RunMessage
    | ErrorMessage
)
SERVER_MESSAGES: tuple[type, ...] = (
    ClustersMessage,
    JobsMessage,
    ClusterMessage,
    WorkersMessage,
    TopicsMessage,
    MetricsMessage,
    RunMessage,
    ErrorMessage,
)


def clusters_message(clusters: list[ClusterSummary]) -> ClustersMessage:
    return {"type": "clusters", "clusters": clusters}


def jobs_message(jobs: Mapping[str, Any]) -> JobsMessage:
    """``jobs``: the manager's ``{"running": [...], "recent": [...], "history": [...]}`` (history optional)."""
    out: JobsMessage = {"type": "jobs", "running": list(jobs["running"]), "recent": list(jobs["recent"])}
    if "history" in jobs:
        out["history"] = list(jobs["history"])
    return out


def cluster_message(name: str, model: dict[str, Any]) -> ClusterMessage:
    return {"type": "cluster", "name": name, "model": model}


def workers_message(name: str, diff: Mapping[str, Any]) -> WorkersMessage:
    """``diff``: a :class:`~jupyter_cluster.server.workers.WorkerFeed` diff (``changed``, ``removed``, maybe ``summary``)."""
    out: WorkersMessage = {
        "type": "workers",
        "name": name,
        "changed": list(diff["changed"]),
        "removed": list(diff["removed"]),
    }
    if "summary" in diff:
        out["summary"] = diff["summary"]
    return out


def topics_message(cluster: str, topics: list[TopicSummary]) -> TopicsMessage:
    return {"type": "topics", "cluster": cluster, "topics": topics}


def metrics_message(cluster: str, topic: str, data: dict[str, Any]) -> MetricsMessage:
    return {"type": "metrics", "cluster": cluster, "topic": topic, "data": data}


def run_message(event: Literal["added", "finished"], run: dict[str, Any]) -> RunMessage:
    return {"type": "run", "event": event, "run": run}


def error_message(message: str) -> ErrorMessage:
    return {"type": "error", "message": message}


# -- panel -> server ---------------------------------------------------------------------------


class WatchMessage(TypedDict):
    """Which cluster's workers and which of its topics to push (``cluster`` None: none)."""

    type: Literal["watch"]
    cluster: str | None
    topics: list[str]


class IntervalMessage(TypedDict):
    """How often to push, in milliseconds (the server keeps it within 0.2-60 s)."""

    type: Literal["interval"]
    ms: float


CLIENT_MESSAGES: tuple[type, ...] = (WatchMessage, IntervalMessage)


def watch_message(cluster: str | None, topics: list[str]) -> WatchMessage:
    """A watch message, as the panel sends it (``model.ts`` ``watchMessage``)."""
    return {"type": "watch", "cluster": cluster, "topics": topics}


def interval_message(ms: float) -> IntervalMessage:
    """An interval message, as the panel sends it (``panel/events.ts``)."""
    return {"type": "interval", "ms": ms}


# -- the control topic -------------------------------------------------------------------------
ControlOp = Literal["scale", "adapt", "stop"]
#: the operations an owner carries out
CONTROL_OPS: tuple[str, ...] = get_args(ControlOp)


class _ControlRequest(TypedDict):
    op: ControlOp
    cluster: str
    id: str


class ControlRequest(_ControlRequest, total=False):
    """A request to a cluster's owner: ``n`` for scale, ``minimum``/``maximum`` for adapt."""

    n: int
    minimum: int | None
    maximum: int | None


class ControlReply(TypedDict):
    """The owner's answer to request ``id``: ``ok``, or the ``error`` in one sentence."""

    op: Literal["reply"]
    id: str
    ok: bool
    error: str | None


def control_request(cluster: str, op: str, request_id: str, **args: Any) -> ControlRequest:
    """A request for ``op`` on ``cluster``; ``args`` are its fields (``n``, ``minimum``, ``maximum``)."""
    if op not in CONTROL_OPS:
        raise ValueError(f"unknown control operation {op!r}")
    unknown = set(args) - set(ControlRequest.__optional_keys__)
    if unknown:
        raise ValueError(f"a {op} request takes no {', '.join(sorted(unknown))}")
    return {"op": op, "cluster": cluster, "id": request_id, **args}  # type: ignore[typeddict-item]


def control_reply(request_id: str, error: str | None) -> ControlReply:
    return {"op": "reply", "id": request_id, "ok": error is None, "error": error}


def message_type(message: type) -> str:
    """The ``type`` an envelope class carries (``ClustersMessage`` -> ``"clusters"``)."""
    return str(get_args(get_type_hints(message)["type"])[0])


def fields(message: type) -> tuple[set[str], set[str]]:
    """An envelope class's (required, optional) field names."""
    return set(message.__required_keys__), set(message.__optional_keys__)  # type: ignore[attr-defined]
