"""The JSON the sidebar and the widgets read, built in one place, and the checks shared by every front end.

Each shape is a :class:`~typing.TypedDict` with one builder function; the kernel
side (``ClusterHandle.model``, progress messages, ``TopicStore.model``), the
Jupyter server (``server.manager``, ``server.jobs``) and the widgets all call
the builders rather than writing dicts by hand.  ``labextension/src/model.ts``
mirrors these shapes; ``tests/wire/test_models.py`` writes example payloads from the
builders into ``labextension/src/__tests__/fixtures/wire.json``, which the
TypeScript tests type-check against ``model.ts`` and feed to the panel's
reducers, so a field renamed on either side fails a test.

Nothing here imports Dask (but for :func:`validate_size`, when called), IPython or tornado.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any, TypedDict

from ..errors import ClusterError

# -- shared checks ---------------------------------------------------------------

#: a cluster name: what the registry, the kernel, the server and the panel accept
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
#: the most workers any front end asks for in one request
MAX_WORKERS = 10_000


def validate_name(name: Any) -> str:
    """``name`` if it is a valid cluster name, else :class:`ClusterError` (one sentence).

    Letters, digits, ``-``, ``_`` and ``.``, at most 63, starting with a letter
    or digit (so a name is safe as a file name and in a URL path).
    """
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise ClusterError(
            f"{name!r} is not a valid cluster name; use letters, digits, '-', '_' or '.' (at most 63, starting with a letter or digit)."
        )
    return name


#: the largest memory size taken (one byte short of 8 EiB): what a worker's int64 byte counts hold
MAX_SIZE = 2**63 - 1


def _size(value: Any) -> int | None:
    """``value`` in bytes if it is a whole number or a text Dask reads as a size (not "auto"), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    # parse_bytes reads a text without digits as one of its unit ("" is 1 byte): a number is asked for
    if not isinstance(value, str) or len(value) > 32 or not any(c.isdigit() for c in value):
        return None
    from dask.utils import parse_bytes  # Dask's own reading: what the workers will make of it

    try:
        return parse_bytes(value)
    # "1e999GB" overflows int(); "nanGB" and "-GB" do not parse
    except (ValueError, TypeError, OverflowError):
        return None


def validate_size(value: Any, what: str, dask: bool = False) -> Any:
    """``value`` if it is a memory size, else :class:`ClusterError` (one sentence quoting it).

    A size is "auto", a whole number of bytes or a text such as "2GiB", from 1
    byte to :data:`MAX_SIZE`.  With ``dask``, also what Dask's ``memory_limit``
    takes besides: 0 (no limit) and a float (a share of the machine's memory
    up to 1, else bytes).
    """
    if dask and isinstance(value, float):
        size = value if math.isfinite(value) else None
    else:
        size = None if value == "auto" else _size(value)
    if value != "auto" and (size is None or not (0 if dask else 1) <= size <= MAX_SIZE):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            shown = repr(value)  # inf, nan: as Python and JSON (Infinity) differ, the plainer one
        else:
            try:
                shown = json.dumps(value)  # "2GiB" quoted as in the sentence; true, [] as in a request
            except (TypeError, ValueError):
                shown = repr(value)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        raise ClusterError(f'{what} must be a size such as "2GiB", "auto", or a whole number of bytes, not {shown}.')
    return value


def validate_count(value: Any, what: str, minimum: int = 0) -> int:
    """``value`` if it is a whole number from ``minimum`` to :data:`MAX_WORKERS`, else :class:`ClusterError`."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_WORKERS:
        raise ClusterError(f"{what} must be a whole number from {minimum} to {MAX_WORKERS}, not {value!r}.")
    return value


# -- clusters --------------------------------------------------------------------


class WorkerModel(TypedDict):
    """One worker as the cluster widget and the panel's worker table show it."""

    name: str
    address: str
    status: str
    nthreads: int
    memory: int
    memory_limit: int
    cpu: float
    executing: int
    resources: dict[str, float]


class ClusterModel(TypedDict):
    """A cluster and its workers (``ClusterHandle.model()``; the panel's detail view adds :class:`ClusterSummary`)."""

    name: str
    backend: str
    address: str
    dashboard_link: str | None
    owns_cluster: bool
    workers: list[WorkerModel]
    n_workers: int
    cores: int
    memory_limit: int
    memory: int


class ClusterSummary(TypedDict):
    """One row of the panel's cluster list (the server's view of a registry record)."""

    name: str
    backend: str
    address: str
    dashboard_link: str | None
    owner_kind: str
    owner_pid: int
    attached: bool
    started: float
    status: str
    error: str | None
    n_workers: int
    cores: int
    memory_limit: int
    jobs_running: int
    topics: list[str]
    #: ids of the Jupyter kernels that started it or attached to it (the panel follows the active
    #: notebook's kernel to its cluster), oldest first
    kernels: list[str]
    #: the cluster's identity (:func:`cluster_id`): a name is reused by later clusters, this never
    id: str


def running_tasks(metrics: Mapping[str, Any]) -> int:
    """Tasks running on a worker, from its heartbeat ``metrics`` as the installed distributed reports them.

    distributed 2026.8 counts tasks per state under ``task_counts`` (running ones are
    ``executing`` and ``long-running``); older versions report ``executing`` directly.
    """
    counts = metrics.get("task_counts")
    if isinstance(counts, Mapping):
        return int(counts.get("executing", 0) or 0) + int(counts.get("long-running", 0) or 0)
    return int(metrics.get("executing", 0) or 0)


def worker_model(address: str, info: Mapping[str, Any]) -> WorkerModel:
    """A worker from the scheduler's ``identity()["workers"][address]``."""
    metrics = info.get("metrics", {}) or {}
    return {
        "name": str(info.get("name", address)),
        "address": address,
        "status": info.get("status", "running"),
        "nthreads": info.get("nthreads", 0),
        "memory": metrics.get("memory", 0),
        "memory_limit": info.get("memory_limit", 0),
        "cpu": metrics.get("cpu", 0.0),
        "executing": running_tasks(metrics),
        "resources": info.get("resources", {}),
    }


def cluster_model(
    name: str,
    backend: str,
    address: str,
    dashboard_link: str | None,
    owns_cluster: bool,
    workers: Mapping[str, Mapping[str, Any]],
) -> ClusterModel:
    """A cluster from the scheduler's worker table (``identity()["workers"]``), workers sorted by name."""
    rows = [worker_model(addr, w) for addr, w in sorted(workers.items(), key=lambda kv: str(kv[1].get("name")))]
    return {
        "name": name,
        "backend": backend,
        "address": address,
        "dashboard_link": dashboard_link,
        "owns_cluster": owns_cluster,
        "workers": rows,
        "n_workers": len(rows),
        "cores": sum(w["nthreads"] for w in rows),
        "memory_limit": sum(w["memory_limit"] or 0 for w in rows),
        "memory": sum(w["memory"] or 0 for w in rows),
    }


def cluster_summary(
    record: Any,
    dashboard_link: str | None,
    status: str,
    error: str | None,
    totals: Mapping[str, int],
    jobs_running: int,
    topics: Iterable[str],
    kernels: Iterable[str] = (),
) -> ClusterSummary:
    """A panel row from a registry record (``registry.ClusterRecord``) and what the server knows of it.

    ``kernels`` are the ids of kernels attached to it besides the record's own
    ``kernel_id`` (which comes first).
    """
    own = getattr(record, "kernel_id", None)
    kernel_ids = [own] if isinstance(own, str) else []
    kernel_ids += [k for k in kernels if isinstance(k, str) and k not in kernel_ids]
    return {
        "name": record.name,
        "backend": record.backend,
        "address": record.address,
        "dashboard_link": dashboard_link,
        "owner_kind": record.owner_kind,
        "owner_pid": record.owner_pid,
        "attached": record.attached,
        "started": record.started,
        "status": status,
        "error": error,
        "n_workers": int(totals.get("n_workers", 0)),
        "cores": int(totals.get("cores", 0)),
        "memory_limit": int(totals.get("memory_limit", 0)),
        "jobs_running": jobs_running,
        "topics": sorted(topics),
        "kernels": kernel_ids,
        "id": cluster_id(record),
    }


def cluster_id(record: Any) -> str:
    """A cluster's identity, as unique as the one scheduler it was: its address, start and owner, hashed.

    A name is only a label (a stopped cluster's name is free for the next);
    what the panel shows, follows and stops is matched by this id.
    """
    import hashlib

    key = f"{record.name}|{record.address}|{float(record.started)!r}|{record.owner_pid}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


class ClusterDetail(ClusterModel, ClusterSummary):
    """The panel's detail view of one cluster: :class:`ClusterModel` plus the summary's fields."""


def cluster_detail(model: ClusterModel, summary: ClusterSummary) -> ClusterDetail:
    """``model`` with the fields of ``summary`` it lacks (``model`` wins where both have one)."""
    detail: dict[str, Any] = dict(summary)
    detail.update(model)
    return detail  # type: ignore[return-value]  # both halves are typed; mypy cannot merge TypedDicts


# -- jobs ------------------------------------------------------------------------

#: a job's states; "lost" is the server's word for a job whose kernel or cluster went away
JOB_STATES = ("running", "finished", "failed", "cancelled", "lost")


#: failed items a job message carries (the first ones), and the length of their texts
MAX_JOB_FAILURES = 5
MAX_FAILURE_TEXT = 300
#: the most characters of a failed item's value the panel is sent
MAX_ITEM_TEXT = 80


class JobFailure(TypedDict):
    """One failed item of a job: what the panel shows when a job with failures is clicked."""

    index: int
    #: "TypeName: message", one line, at most MAX_FAILURE_TEXT characters
    error: str
    #: the remote traceback's last lines (at most MAX_FAILURE_TEXT characters), or ""
    traceback: str
    #: the worker's address, or None where the job did not record it
    worker: str | None
    #: the failed item's value as text (its repr, clipped), or None where the job did not record it
    item: str | None


def _clip(text: str, limit: int = MAX_FAILURE_TEXT) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def job_failure(index: int, error: Any, traceback: Any = "", worker: Any = None, item: Any = None) -> JobFailure:
    """A failed item, bounded: the error on one line, the traceback's last lines."""
    if isinstance(error, BaseException):
        msg = str(error).strip().splitlines()
        name = type(error).__name__
        if name == "RemoteItemError" and msg:  # the engine's stand-in already reads "TypeName: message"
            error = msg[0]
        else:
            error = f"{name}: {msg[0]}" if msg else name
    first = str(error).strip().splitlines()
    tb = str(traceback or "").rstrip().splitlines()
    tail = "\n".join(line for line in tb[-4:])
    if len(tail) > MAX_FAILURE_TEXT:
        tail = "…" + tail[-(MAX_FAILURE_TEXT - 1) :]
    return {
        "index": int(index),
        "error": _clip(first[0] if first else ""),
        "traceback": tail,
        "worker": str(worker) if worker else None,
        "item": _clip(item if isinstance(item, str) else repr(item), MAX_ITEM_TEXT) if item is not None else None,
    }


def job_failures(raw: Any) -> list[JobFailure]:
    """Checked failures of a message from the jobs topic (anything malformed is dropped)."""
    out: list[JobFailure] = []
    # a list as sent, a tuple as it arrives: Dask's events go through msgpack, which hands sequences back as tuples
    for f in raw if isinstance(raw, (list, tuple)) else []:
        if not isinstance(f, dict):
            continue
        index = f.get("index")
        if isinstance(index, bool) or not isinstance(index, int):
            continue
        item = f.get("item")
        out.append(
            job_failure(
                index,
                f.get("error") or "",
                f.get("traceback") or "",
                f.get("worker"),
                item if isinstance(item, str) else None,
            )
        )
        if len(out) == MAX_JOB_FAILURES:
            break
    return out


class JobMessage(TypedDict):
    """One progress update of a map job, on the jobs topic and in the panel's job list."""

    job: str
    label: str
    kernel: int | None
    cluster: str | None
    total: int | None
    done: int
    failed: int
    state: str
    started: float
    updated: float
    #: the first failed items (at most MAX_JOB_FAILURES), by index
    failures: list[JobFailure]
    #: the Jupyter kernel that runs it (its id, as the browser's session names it), or None outside
    #: a kernel: the panel follows the active notebook to the cluster of its maps with it
    kernel_id: str | None


#: a kernel id as the registry and the job messages carry it (the <id> of kernel-<id>.json)
KERNEL_ID_RE = re.compile(r"[A-Za-z0-9_.-]{1,128}")


def kernel_id_or_none(value: Any) -> str | None:
    """``value`` if it can be a kernel id, else None (ids come from files and messages: checked, never trusted)."""
    return value if isinstance(value, str) and KERNEL_ID_RE.fullmatch(value) else None


def job_message(
    job: str,
    label: str,
    kernel: int | None,
    cluster: str | None,
    total: int | None,
    done: int,
    failed: int,
    state: str,
    started: float,
    updated: float,
    failures: list[JobFailure] | None = None,
    kernel_id: str | None = None,
) -> JobMessage:
    """A job update (published by :mod:`.telemetry.progress`, normalised by ``server.jobs``)."""
    return {
        "job": job,
        "label": label,
        "kernel": kernel,
        "cluster": cluster,
        "total": total,
        "done": done,
        "failed": failed,
        "state": state if state in JOB_STATES else "running",
        "started": started,
        "updated": updated,
        "failures": sorted(failures or [], key=lambda f: f["index"])[:MAX_JOB_FAILURES],
        "kernel_id": kernel_id_or_none(kernel_id),
    }


# -- metrics ---------------------------------------------------------------------


class VectorSeries(TypedDict):
    """A numeric vector's rows over steps (a heatmap)."""

    steps: list[float]
    rows: list[list[float | None]]


class MetricsModel(TypedDict):
    """A metrics topic, downsampled for a chart: what the widgets and the panel draw."""

    topic: str
    #: value name -> series key ("member=3", or "all") -> [step, value] points
    scalars: dict[str, dict[str, list[list[float | None]]]]
    #: value name -> series key -> rows over steps
    vectors: dict[str, dict[str, VectorSeries]]
    #: reports that were sent but never arrived
    dropped: int
    received: int
    #: series key -> [step, time] when its reports were made (seconds since the epoch), sorted by
    #: step and thinned: the charts' wall-time and relative-time x axes
    times: dict[str, list[list[float]]]
    #: points the curves lost from their start to the history cap (``jupyter-cluster.metrics.history``
    #: per value and series): when above 0, the charts do not reach back to the first reports
    truncated: int


def metrics_model(
    topic: str,
    scalars: dict[str, dict[str, list[list[float | None]]]],
    vectors: dict[str, dict[str, VectorSeries]],
    dropped: int,
    received: int,
    times: dict[str, list[list[float]]] | None = None,
    truncated: int = 0,
) -> MetricsModel:
    """A topic's chart model (built by ``TopicStore.model``)."""
    return {
        "topic": topic,
        "scalars": scalars,
        "vectors": vectors,
        "dropped": dropped,
        "received": received,
        "times": times or {},
        "truncated": truncated,
    }


class TopicSummary(TypedDict):
    """What one metrics topic holds, without its points (the panel's topic list)."""

    topic: str
    version: int
    received: int
    dropped: int
    #: points its curves lost to the history cap (:attr:`MetricsModel.truncated`)
    truncated: int
    scalars: list[str]
    vectors: list[str]
    series: int


def topic_summary(store: Any) -> TopicSummary:
    """The summary of a ``TopicStore`` (or a stopped cluster's kept topic)."""
    return {
        "topic": store.topic,
        "version": store.version,
        "received": store.received,
        "dropped": store.dropped,
        "truncated": store.truncated,
        "scalars": sorted(store.scalars),
        "vectors": sorted(store.vectors),
        "series": len(store.series),
    }
