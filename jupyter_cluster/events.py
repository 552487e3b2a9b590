"""Metrics reported from tasks (or the notebook) and their history in the kernel.

Reports travel over Dask's own event topics, so they cross machines without a
new server::

    task: report(step=..., reward=...)   ─► per-process buffer (flushed every ~100 ms
                                             and at the end of every task)
          ─► Worker.log_event("jupyter-cluster:metrics:<topic>", batch)
          ─► scheduler (keeps only the last ``events-log-length`` events per topic)
          ─► kernel: Client.subscribe_topic ─► TopicStore (bounded history) ─► widgets

Wire format
-----------
Every event on ``jupyter-cluster:metrics:<topic>`` is one *batch*::

    {"topic": "<topic>", "source": "<producer id>", "seq": 17, "records": [record, ...], "worker": addr}

where ``seq`` numbers the batch's first record among everything that producer
sent on that topic (records are numbered 0, 1, 2, ... per producer and topic),
and each record is ``{"step": int|None, "time": float, "series": {...},
"values": {...}}``.  :func:`records` expands a batch into the flat record dicts
of the shared interface (``topic`` and ``worker`` filled in).  The numbering
lets a subscriber drop duplicates (live stream vs. the scheduler's backlog) and
count exactly what it never got (:attr:`TopicStore.dropped`).

Each batch (which also carries ``"topic"``) is logged on its own topic *and*
on ``jupyter-cluster:metrics``, so one subscription made before the work
starts receives every topic, new ones included, while each topic keeps its
own backlog on the scheduler for late subscribers (see :class:`Hub`).
"""

from __future__ import annotations

import bisect
import logging
import math
import numbers
import os
import threading
import time
import uuid
from array import array
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from . import config

logger = logging.getLogger(__name__)

PREFIX = "jupyter-cluster:metrics:"
INDEX_TOPIC = "jupyter-cluster:metrics"
JOBS_TOPIC = "jupyter-cluster:jobs"
PLUGIN_NAME = "jupyter-cluster-events"

#: records per batch on the wire; bigger buffers are split so no single message is huge
MAX_BATCH = 5000
#: longest numeric vector a single value may hold
MAX_VECTOR = 65536

_DEFAULT_IDENTITY = ("member", "run", "trial", "rank", "replica", "seed", "agent", "actor", "env", "expert_group")


def topic_name(topic: str) -> str:
    """The Dask event topic that carries metrics topic ``topic``."""
    return PREFIX + topic


def _setting(key: str, default: Any) -> Any:
    value = config.get(f"metrics.{key}")
    return default if value is None else value


def identity_fields() -> frozenset[str]:
    """Names whose numeric values identify a series rather than being measured.

    String values always identify a series; integers identify one only when
    their name is listed in ``jupyter-cluster.metrics.identity-fields``
    (e.g. ``member``, ``run``, ``trial``) or passed through ``series=``.
    """
    global _identity_cache
    now = time.monotonic()
    if _identity_cache is None or now - _identity_cache[0] > 1.0:  # report() may run 10^4 times a second
        _identity_cache = (now, frozenset(_setting("identity-fields", _DEFAULT_IDENTITY)))
    return _identity_cache[1]


_identity_cache: tuple[float, frozenset[str]] | None = None

#: the integers msgpack (Dask's wire format) can carry; a larger one would
#: break the connection of the worker that sends it (issue 18.3)
INT_MIN, INT_MAX = -(2**63), 2**64 - 1


def _sendable_number(name: str, v: float | int, what: str = "is") -> float | int:
    """``v`` as msgpack carries it: ints beyond 64 bits become floats (or TypeError if too large)."""
    if type(v) is int and not INT_MIN <= v <= INT_MAX:
        try:
            return float(v)
        except OverflowError:
            raise TypeError(
                f"report(): value {name!r} {what} an integer too large to send ({len(str(abs(v)))} digits); report it as a float or a string field."
            ) from None
    return v


def _text_ok(s: str) -> bool:
    """Whether ``s`` can be sent as UTF-8 (no lone surrogates)."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# -- validation -----------------------------------------------------------------
def _scalar(v: Any) -> float | int | None:
    """A plain Python number for ``v`` (numpy/torch 0-d too), or None if it is not one."""
    t = type(v)
    if t is float or t is int:  # the common case, without the ABC checks below
        return v
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, numbers.Integral):
        return int(v)
    if isinstance(v, numbers.Real):
        return float(v)
    shape = getattr(v, "shape", None)
    if shape is not None and tuple(shape) == () and hasattr(v, "item"):
        item = v.item()
        if isinstance(item, (bool, numbers.Real)):
            return _scalar(item)
    return None


def _vector(name: str, v: Any) -> list[float] | None:
    """A flat list of floats for a sequence/array value, None if ``v`` is not a sequence."""
    if isinstance(v, (str, bytes, dict)):
        return None
    if hasattr(v, "tolist") and getattr(v, "shape", None) is not None:
        shape = tuple(v.shape)
        if len(shape) != 1:
            raise TypeError(
                f"report(): value {name!r} is an array of shape {shape}; values must be numbers or flat (1-D) sequences of numbers."
            )
        v = v.tolist()
    if not isinstance(v, (list, tuple)):
        return None
    if len(v) > MAX_VECTOR:
        raise TypeError(f"report(): value {name!r} has {len(v)} entries; at most {MAX_VECTOR} are allowed per value.")
    out = []
    for x in v:
        s = _scalar(x)
        if s is None:
            raise TypeError(
                f"report(): value {name!r} contains {type(x).__name__} {x!r:.40}; sequences must hold only numbers (flat, not nested)."
            )
        out.append(float(_sendable_number(name, s, "contains")))
    return out


def validate(step: Any, topic: Any, series: Any, fields: dict[str, Any]) -> tuple[int | None, dict, dict]:
    """Check a report's arguments; return ``(step, series, values)`` as msgpack-safe data.

    Raises
    ------
    TypeError
        With one sentence naming the bad argument and what is accepted.
    """
    if (
        not isinstance(topic, str)
        or not topic
        or len(topic) > 200
        or any(ord(c) < 32 for c in topic)
        or not _text_ok(topic)
    ):
        raise TypeError(
            f"report(): topic must be a non-empty string of printable characters (at most 200), not {topic!r:.60}."
        )
    if step is not None and type(step) is not int:
        s = None if isinstance(step, bool) else _scalar(step)
        if s is None:
            raise TypeError(f"report(): step must be an integer or None, not {type(step).__name__} {step!r:.40}.")
        if isinstance(s, float):
            if not s.is_integer():
                raise TypeError(f"report(): step must be an integer or None, not {step!r}.")
            s = int(s)
        step = s
    if step is not None and not INT_MIN <= step <= INT_MAX:
        raise TypeError(f"report(): step must be an integer from {INT_MIN} to {INT_MAX}, not {step}.")
    ident: dict[str, Any] = {}
    if series is not None:
        if not isinstance(series, dict):
            raise TypeError(
                f"report(): series= must be a dict of identity fields such as {{'member': 3}}, not {type(series).__name__}."
            )
        for k, v in series.items():
            if not isinstance(k, str) or not _text_ok(k):
                raise TypeError(f"report(): series field names must be strings of valid text, not {k!r}.")
            s = None if isinstance(v, str) else _scalar(v)
            if (isinstance(v, str) and _text_ok(v)) or (
                s is not None and not isinstance(s, float) and INT_MIN <= s <= INT_MAX
            ):
                ident[k] = v if isinstance(v, str) else s
            else:
                raise TypeError(
                    f"report(): series field {k!r} must be a string or an integer of at most 64 bits, not {type(v).__name__} {v!r:.40}."
                )
    names = identity_fields()
    values: dict[str, Any] = {}
    for k, v in fields.items():
        if not _text_ok(k):
            raise TypeError(
                f"report(): field name {k!r} is not valid text (it holds a lone surrogate); use another name."
            )
        if isinstance(v, str):
            if len(v) > 200:
                raise TypeError(
                    f"report(): identity field {k!r} is a string of {len(v)} characters; at most 200 are allowed."
                )
            if not _text_ok(v):
                raise TypeError(
                    f"report(): identity field {k!r} is not valid text (it holds a lone surrogate): {v!r:.40}."
                )
            ident[k] = v
            continue
        s = _scalar(v)
        if s is not None:
            if k in names and type(s) is int:
                if not INT_MIN <= s <= INT_MAX:
                    raise TypeError(f"report(): identity field {k!r} must be an integer of at most 64 bits, not {s}.")
                ident[k] = s
            else:
                values[k] = _sendable_number(k, s)
            continue
        vec = _vector(k, v)
        if vec is None:
            raise TypeError(
                f"report(): value {k!r} is a {type(v).__name__}; values must be numbers or flat sequences of numbers, "
                "and identity fields (like member=3 or run='lr=0.1') strings or integers."
            )
        values[k] = vec
    if not values:
        raise TypeError("report(): give at least one value to record, e.g. report(step=3, reward=1.5).")
    return step, ident, values


def series_key(series: dict[str, Any]) -> str:
    """The string naming a series: ``"member=3"``, ``"member=3, run=a"`` or ``"all"``."""
    if not series:
        return "all"
    return ", ".join(f"{k}={series[k]}" for k in sorted(series))


# -- producing ------------------------------------------------------------------
class _Producer:
    """This process's buffered reports: numbered per topic, flushed in batches.

    One per process.  Batching turns 10,000 reports a second into ~10 events a
    second per worker, so the scheduler's short per-topic log holds far more
    history and its event loop stays free.
    """

    def __init__(self) -> None:
        self.source = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self._lock = threading.Lock()
        self._buffers: dict[str, list[dict]] = {}
        self._next_seq: dict[str, int] = {}
        self._flushed_seq: dict[str, int] = {}
        self._armed = False

    def add(self, topic: str, record: dict) -> tuple[int, bool]:
        """Buffer ``record``; return its sequence number and whether a flush must be armed."""
        with self._lock:
            seq = self._next_seq.get(topic, 0)
            self._next_seq[topic] = seq + 1
            if topic not in self._buffers:
                self._buffers[topic] = []
                self._flushed_seq.setdefault(topic, seq)
            self._buffers[topic].append(record)
            arm = not self._armed
            self._armed = True
            return seq, arm

    def take(self, discard: bool = False) -> list[tuple[list[str], Any]]:
        """Empty the buffers; return ``(dask_topic, message)`` pairs in the order to send.

        With ``discard`` (a kernel with no cluster) nothing is returned and
        the numbering moves on, so a later subscriber counts the gap.
        """
        with self._lock:
            buffers, self._buffers = self._buffers, {}
            self._armed = False
            out: list[tuple[str, Any]] = []
            for topic, recs in buffers.items():
                if discard:
                    self._flushed_seq[topic] += len(recs)
                    continue
                seq = self._flushed_seq[topic]
                for i in range(0, len(recs), MAX_BATCH):
                    chunk = recs[i : i + MAX_BATCH]
                    msg = {"topic": topic, "source": self.source, "seq": seq, "records": chunk}
                    out.append(([topic_name(topic), INDEX_TOPIC], msg))
                    seq += len(chunk)
                self._flushed_seq[topic] = seq
            return out

    @property
    def pending(self) -> bool:
        return bool(self._buffers)


_producer = _Producer()


def _flush_interval() -> float:
    from dask.utils import parse_timedelta

    return float(parse_timedelta(_setting("flush-interval", "100ms")))


def _current_worker():
    """The Dask worker running this code, or None in the notebook."""
    try:
        from distributed.worker import get_worker
    except ImportError:  # pragma: no cover - distributed is a dependency
        return None
    try:
        return get_worker()
    except ValueError:
        pass
    # a thread started by a task does not inherit the task's context
    from distributed.worker import Worker

    running = [w for w in list(Worker._instances) if getattr(w.status, "name", "") == "running"]
    return running[0] if len(running) == 1 else None


def _flush_on_worker(worker) -> None:
    """Send this process's buffered reports through ``worker``'s scheduler stream.

    Runs on the worker's event loop (timer, flush plugin, :func:`flush`), so
    batches leave in the order they were taken.
    """
    send = getattr(worker, "batched_send", None)
    for dask_topic, msg in _producer.take():
        try:
            if send is not None:
                # what Worker.log_event sends, minus its recursive msgpack check
                # (~10 us per record); report() has validated every value already
                send({"op": "log-event", "topic": dask_topic, "msg": msg})
            else:  # pragma: no cover - older/newer distributed
                worker.log_event(dask_topic, msg)
        except (
            Exception
        ):  # a closing worker loses its last reports; the subscriber counts the gap only if later ones arrive
            logger.debug("could not send metrics batch on %s", dask_topic, exc_info=True)


async def flush_to_scheduler(worker) -> None:
    """Send this process's buffered reports and return once the scheduler holds them.

    For results that do not pass the scheduler (the map engine's direct
    batches): awaited before a batch's result is returned, so a task's reports
    reach the scheduler before its result reaches the client, and a worker
    lost right after its answer takes no report of a finished item with it.
    The batched stream (:func:`_flush_on_worker`) gives no such moment.
    Producer sequence numbers keep the stores exact whichever way a batch goes.
    """
    if not _producer.pending:
        return
    for dask_topic, msg in _producer.take():
        try:
            await worker.scheduler.log_event(topic=dask_topic, msg=msg)
        except Exception:  # a scheduler that went away: the subscriber counts the gap
            logger.debug("could not send metrics batch on %s", dask_topic, exc_info=True)


def _arm_worker_flush(worker) -> None:
    def arm() -> None:
        worker.loop.call_later(_flush_interval(), _flush_on_worker, worker)

    worker.loop.add_callback(arm)


class FlushPlugin:
    """Worker plugin: flush buffered reports when a task finishes.

    The batch then goes out on the worker's stream before the task's result,
    so a kernel subscribed to the topic holds a task's reports by the time it
    sees the task finish.
    """

    idempotent = True
    name = PLUGIN_NAME

    def setup(self, worker) -> None:
        self._worker = worker

    def transition(self, key, start, finish, *args, **kwargs) -> None:
        if start == "executing" and _producer.pending:
            _flush_on_worker(self._worker)

    def teardown(self, worker) -> None:
        _flush_on_worker(worker)


def __getattr__(name: str):
    # Built on first use so that importing jupyter_cluster does not import
    # distributed; pickled by reference as jupyter_cluster.events._WorkerFlushPlugin.
    if name == "_WorkerFlushPlugin":
        from distributed import WorkerPlugin

        cls = type("_WorkerFlushPlugin", (FlushPlugin, WorkerPlugin), {"__module__": __name__})
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _as_worker_plugin():
    return (
        __getattr__("_WorkerFlushPlugin")()
        if "_WorkerFlushPlugin" not in globals()
        else globals()["_WorkerFlushPlugin"]()
    )


# Kernel-side reports are published through the current cluster's client, in order.
_kernel_flush_lock = threading.Lock()


def _flush_from_kernel() -> bool:
    handle = _current_handle()
    batch = _producer.take(discard=handle is None)
    for dask_topic, msg in batch:
        publish(handle.client, dask_topic, msg)
    return False


def _current_handle():
    try:
        from . import session

        h = session.current()
    except Exception:
        return None
    return None if h is None or h.closed else h


def report(step: int | None = None, topic: str = "default", *, series: dict | None = None, **values: Any) -> None:
    """Record metric values, from a task on any worker or from the notebook.

    Parameters
    ----------
    step : int, optional
        The x coordinate (generation, epoch, environment step).  When omitted,
        each series counts its own reports 0, 1, 2, ...
    topic : str
        Groups related values; ``show_metrics(topic)`` draws one topic.
    series : dict, optional
        Identity fields, e.g. ``{"member": 3}``; same as passing them as
        keywords when they are strings or listed identity names.
    **values
        Numbers (scalars become lines, one per series) or flat numeric
        sequences (vectors become a heatmap over steps, e.g. tokens per
        expert).  String keywords such as ``run="lr=0.1"`` and integer
        keywords named in ``jupyter-cluster.metrics.identity-fields`` (by
        default ``member``, ``run``, ``trial``, ``rank``, ``seed``, ...) are
        identity fields that split the topic into series.

    Raises
    ------
    TypeError
        At the call, when a value cannot be recorded.

    Examples
    --------
    >>> import jupyter_cluster as jc
    >>> jc.report(step=3, topic="es", member=7, reward=12.5)          # doctest: +SKIP
    >>> jc.report(step=3, topic="moe", tokens_per_expert=[10, 0, 4])    # doctest: +SKIP
    """
    step, ident, vals = validate(step, topic, series, values)
    record = {"step": step, "time": time.time(), "series": ident, "values": vals}
    worker = _current_worker()
    seq, arm = _producer.add(topic, record)
    if worker is not None:
        if arm:
            _arm_worker_flush(worker)
        return
    # in the notebook: visible at once here, published for the sidebar and other kernels
    store(topic).add(_producer.source, seq, [record], worker="kernel")
    if arm:
        from . import ticker

        ticker.every(_flush_interval(), _flush_from_kernel)
        if _current_handle() is not None:
            attach(_current_handle().client)


def publish(client, dask_topic: str | list[str], msg: Any) -> None:
    """Log ``msg`` on ``dask_topic`` through ``client`` without blocking; order is kept.

    Used for kernel-side metric batches and for job progress
    (:data:`JOBS_TOPIC`).  Failures (a scheduler that went away) are logged
    at debug level and otherwise ignored.
    """
    state = _publishers.setdefault(client.id, {"lock": None})

    async def send() -> None:
        import asyncio

        if state["lock"] is None:
            state["lock"] = asyncio.Lock()
        async with state["lock"]:
            try:
                await client.scheduler.log_event(topic=dask_topic, msg=msg)
            except Exception:
                logger.debug("could not publish on %s", dask_topic, exc_info=True)

    try:
        client.loop.add_callback(send)
    except Exception:  # a closed client
        logger.debug("client closed; %s message not published", dask_topic)


_publishers: dict[str, dict] = {}


def flush() -> None:
    """Send this process's buffered reports now (normally done every ~100 ms)."""
    worker = _current_worker()
    if worker is not None:
        worker.loop.add_callback(_flush_on_worker, worker)
    else:
        _flush_from_kernel()


# -- receiving ------------------------------------------------------------------
class _Coverage:
    """Which sequence numbers of one producer have arrived (merged intervals)."""

    __slots__ = ("intervals", "covered", "high")

    def __init__(self) -> None:
        self.intervals: list[tuple[int, int]] = []
        self.covered = 0
        self.high = 0

    def claim(self, start: int, end: int) -> list[tuple[int, int]]:
        """Mark ``[start, end)`` as arrived; return the parts that had not."""
        new: list[tuple[int, int]] = []
        cur = start
        for a, b in self.intervals:
            if b <= cur:
                continue
            if a >= end:
                break
            if a > cur:
                new.append((cur, a))
            cur = max(cur, b)
            if cur >= end:
                break
        if cur < end:
            new.append((cur, end))
        if new:
            merged: list[tuple[int, int]] = []
            for a, b in sorted(self.intervals + [(start, end)]):
                if merged and a <= merged[-1][1]:
                    merged[-1] = (merged[-1][0], max(merged[-1][1], b))
                else:
                    merged.append((a, b))
            self.intervals = merged
            self.covered += sum(b - a for a, b in new)
        self.high = max(self.high, end)
        return new


class _Column:
    """One scalar value of one series: steps and values, kept sorted by step."""

    __slots__ = ("steps", "values", "count", "version", "cache")

    def __init__(self) -> None:
        self.steps = array("d")
        self.values = array("d")
        self.count = 0  # points ever added (x for reports without a step)
        self.version = 0
        self.cache: tuple | None = None

    def add(self, step: float, value: float, limit: int) -> None:
        if not self.steps or step >= self.steps[-1]:
            self.steps.append(step)
            self.values.append(value)
        else:  # reports of one series from two workers may interleave
            i = bisect.bisect_right(self.steps, step)
            self.steps.insert(i, step)
            self.values.insert(i, value)
        self.count += 1
        self.version += 1
        if len(self.steps) > limit:
            cut = max(1, limit // 10)
            del self.steps[:cut]
            del self.values[:cut]


class _VectorColumn:
    """One vector value of one series: a row per step."""

    __slots__ = ("steps", "rows", "count", "version", "cache")

    def __init__(self, limit: int) -> None:
        self.steps: deque[float] = deque(maxlen=limit)
        self.rows: deque[list[float]] = deque(maxlen=limit)
        self.count = 0
        self.version = 0
        self.cache: tuple | None = None

    def add(self, step: float, row: list[float]) -> None:
        if self.steps and step < self.steps[-1]:
            items = sorted(zip(list(self.steps) + [step], list(self.rows) + [row]), key=lambda p: p[0])
            self.steps.clear()
            self.rows.clear()
            for s, r in items:
                self.steps.append(s)
                self.rows.append(r)
        else:
            self.steps.append(step)
            self.rows.append(row)
        self.count += 1
        self.version += 1


def _json_number(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _downsample(steps: array, values: array, cap: int) -> list[list]:
    """At most ~``cap`` points that keep each bucket's minimum and maximum (peaks survive)."""
    n = len(steps)
    if n <= cap:
        return [[s, _json_number(v)] for s, v in zip(steps, values)]
    buckets = max(1, cap // 2)
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy comes with pandas in practice
        stride = -(-n // cap)
        idx = list(range(0, n, stride))
        if idx[-1] != n - 1:
            idx.append(n - 1)
        return [[steps[i], _json_number(values[i])] for i in idx]
    s = np.frombuffer(steps, dtype=np.float64)
    v = np.frombuffer(values, dtype=np.float64)
    k = -(-n // buckets)
    pad = buckets * k - n
    lo = np.where(np.isnan(v), np.inf, v)
    hi = np.where(np.isnan(v), -np.inf, v)
    lo = np.concatenate([lo, np.full(pad, np.inf)]).reshape(buckets, k)
    hi = np.concatenate([hi, np.full(pad, -np.inf)]).reshape(buckets, k)
    base = np.arange(buckets) * k
    idx = np.unique(np.concatenate([lo.argmin(axis=1) + base, hi.argmax(axis=1) + base, [n - 1]]))
    idx = idx[idx < n]
    return [[a, (b if math.isfinite(b) else None)] for a, b in zip(s[idx].tolist(), v[idx].tolist())]


def _downsample_rows(steps: deque, rows: deque, cap: int) -> dict[str, list]:
    """At most ``cap`` rows: consecutive rows are averaged in equal buckets."""
    n = len(steps)
    if n <= cap:
        return {"steps": list(steps), "rows": [[_json_number(x) for x in r] for r in rows]}
    k = -(-n // cap)
    out_steps: list[float] = []
    out_rows: list[list] = []
    steps_l, rows_l = list(steps), list(rows)
    for i in range(0, n, k):
        chunk = rows_l[i : i + k]
        width = max(len(r) for r in chunk)
        sums = [0.0] * width
        counts = [0] * width
        for r in chunk:
            for j, x in enumerate(r):
                if math.isfinite(x):
                    sums[j] += x
                    counts[j] += 1
        out_steps.append(steps_l[i])
        out_rows.append([(sums[j] / counts[j]) if counts[j] else None for j in range(width)])
    return {"steps": out_steps, "rows": out_rows}


class TopicStore:
    """Everything this process has received on one metrics topic (bounded).

    Thread-safe: batches arrive on the Dask client's event-loop thread while
    the notebook reads from the main thread and widgets from the ticker.

    Attributes
    ----------
    topic : str
    received : int
        Reports received (after dropping duplicates).
    version : int
        Grows with every change; cheap "has anything changed?" for renderers.
    """

    def __init__(self, topic: str, history: int | None = None, vector_history: int | None = None) -> None:
        self.topic = topic
        self.history = int(history or _setting("history", 100_000))
        self.vector_history = int(vector_history or _setting("vector-history", 5_000))
        self._lock = threading.RLock()
        self._rows: deque[tuple] = deque(maxlen=self.history)
        self.series: dict[str, dict] = {}
        self.scalars: dict[str, dict[str, _Column]] = {}
        self.vectors: dict[str, dict[str, _VectorColumn]] = {}
        self._coverage: dict[str, _Coverage] = {}
        self._counts: dict[str, int] = {}
        self._columns: dict[tuple[str, str], Any] = {}
        self._last_series: tuple[dict, str] | None = None
        self.received = 0
        self.version = 0
        self._listeners: list[Callable[[TopicStore, list[dict]], None]] = []

    # -- input -------------------------------------------------------------------
    def add(self, source: str, seq: int, records: list[dict], worker: str | None = None) -> int:
        """Add a batch of ``records`` numbered ``seq, seq+1, ...`` by ``source``; return how many were new."""
        added: list[dict] = []
        with self._lock:
            cov = self._coverage.setdefault(source, _Coverage())
            for a, b in cov.claim(seq, seq + len(records)):
                for rec in records[a - seq : b - seq]:
                    self._ingest(rec, worker)
                    added.append(rec)
            if added:
                self.received += len(added)
                self.version += 1
            listeners = list(self._listeners)
        for cb in listeners:
            try:
                cb(self, added)
            except Exception:
                logger.exception("metrics listener %r failed", cb)
        return len(added)

    def _ingest(self, rec: dict, worker: str | None) -> None:
        ident = rec.get("series") or {}
        last = self._last_series
        if last is not None and (ident is last[0] or ident == last[0]):
            key = last[1]  # consecutive reports of one series: skip building the key
        else:
            key = series_key(ident)
            if key not in self.series:
                self.series[key] = dict(ident)
            self._last_series = (ident, key)
        counter = self._counts.get(key, 0)
        self._counts[key] = counter + 1
        step = rec.get("step")
        x = float(step) if step is not None else float(counter)
        vals = rec.get("values") or {}
        columns = self._columns
        for name, v in vals.items():
            col = columns.get((name, key))
            if isinstance(v, (list, tuple)):
                v = [float(z) for z in v]  # msgpack hands sequences back as tuples
                if type(vals) is dict:
                    vals = dict(vals)
                vals[name] = v
                if col is None:
                    col = columns[(name, key)] = self.vectors.setdefault(name, {})[key] = _VectorColumn(
                        self.vector_history
                    )
                col.add(x, v)
            else:
                if col is None:
                    col = columns[(name, key)] = self.scalars.setdefault(name, {})[key] = _Column()
                col.add(x, float(v), self.history)
        self._rows.append((step, rec.get("time"), worker, key, vals))

    def listen(self, callback: Callable[[TopicStore, list[dict]], None]) -> Callable[[], None]:
        """Call ``callback(store, new_records)`` after every batch; returns a function that stops it."""
        with self._lock:
            self._listeners.append(callback)

        def stop() -> None:
            with self._lock:
                if callback in self._listeners:
                    self._listeners.remove(callback)

        return stop

    # -- output ------------------------------------------------------------------
    @property
    def dropped(self) -> int:
        """Reports that were sent but never reached this process (gaps in the numbering)."""
        with self._lock:
            return sum(c.high - c.covered for c in self._coverage.values())

    def rows(self) -> list[dict]:
        """The kept reports, oldest first, as flat dicts (step, time, worker, identity fields, values)."""
        with self._lock:
            rows = list(self._rows)
            series = dict(self.series)
        out = []
        for step, t, worker, key, vals in rows:
            d = {"step": step, "time": t, "worker": worker}
            d.update(series[key])
            d.update(vals)
            out.append(d)
        return out

    def model(self, max_points: int | None = None, max_cells: int | None = None, per_series_points: int = 4000) -> dict:
        """The shared metrics data model (JSON), downsampled for a browser.

        Parameters
        ----------
        max_points : int
            Points per scalar chart, shared by its series (min/max per bucket
            beyond that, so peaks stay visible).
        max_cells : int
            Heatmap cells per vector value, shared by its series (rows are
            averaged in buckets beyond that).
        """
        max_points = int(max_points or _setting("chart-points", 20_000))
        max_cells = int(max_cells or _setting("chart-cells", 200_000))
        with self._lock:
            scalars: dict[str, dict[str, list]] = {}
            for name, cols in self.scalars.items():
                cap = max(50, min(per_series_points, max_points // max(1, len(cols))))
                out = scalars[name] = {}
                for key, col in cols.items():
                    if col.cache is None or col.cache[:2] != (col.version, cap):
                        col.cache = (col.version, cap, _downsample(col.steps, col.values, cap))
                    out[key] = col.cache[2]
            vectors: dict[str, dict[str, dict]] = {}
            for name, vcols in self.vectors.items():
                width = max((len(c.rows[-1]) for c in vcols.values() if c.rows), default=1) or 1
                cap = max(10, max_cells // (width * max(1, len(vcols))))
                vout = vectors[name] = {}
                for key, vcol in vcols.items():
                    if vcol.cache is None or vcol.cache[:2] != (vcol.version, cap):
                        vcol.cache = (vcol.version, cap, _downsample_rows(vcol.steps, vcol.rows, cap))
                    vout[key] = vcol.cache[2]
            return {
                "topic": self.topic,
                "scalars": scalars,
                "vectors": vectors,
                "dropped": sum(c.high - c.covered for c in self._coverage.values()),
                "received": self.received,
            }

    def summary(self) -> str:
        """A few lines of plain text: per value, the latest value of each series."""
        with self._lock:
            lines = [
                f"metrics {self.topic!r}: {self.received} reports, {len(self.series)} series, {self.dropped} dropped"
            ]
            for name, cols in sorted(self.scalars.items()):
                parts = []
                for key, col in sorted(cols.items())[:8]:
                    if col.values:
                        parts.append(f"{key}: {col.values[-1]:.4g} @ {col.steps[-1]:g}")
                more = f" (+{len(cols) - 8} more)" if len(cols) > 8 else ""
                lines.append(f"  {name}: " + "; ".join(parts) + more)
            for name, vcols in sorted(self.vectors.items()):
                for key, vcol in sorted(vcols.items())[:4]:
                    if vcol.rows:
                        row = vcol.rows[-1]
                        shown = ", ".join(f"{x:.3g}" for x in row[:8]) + (", ..." if len(row) > 8 else "")
                        lines.append(f"  {name}[{key}] @ {vcol.steps[-1]:g}: [{shown}] ({len(row)} entries)")
            if len(lines) == 1:
                lines.append("  (nothing reported yet)")
            return "\n".join(lines)


_stores: dict[str, TopicStore] = {}
_stores_lock = threading.Lock()


def store(topic: str) -> TopicStore:
    """This process's :class:`TopicStore` for ``topic`` (created empty if new)."""
    with _stores_lock:
        s = _stores.get(topic)
        if s is None:
            s = _stores[topic] = TopicStore(topic)
        return s


def topics() -> list[str]:
    """Metrics topics this process has seen so far."""
    with _stores_lock:
        return sorted(_stores)


def records(topic: str, msg: dict) -> list[dict]:
    """Expand one event message from ``topic_name(topic)`` into flat record dicts.

    Each dict has the keys of the shared interface: ``topic``, ``step``,
    ``time``, ``series``, ``values``, ``worker`` (plus ``source``/``seq``).
    """
    out = []
    worker = msg.get("worker")
    seq = msg.get("seq", 0)
    for i, rec in enumerate(msg.get("records", ())):
        d = dict(rec)
        d.update(topic=topic, worker=worker, source=msg.get("source"), seq=seq + i)
        out.append(d)
    return out


class Hub:
    """One client's live feed of every metrics topic of its cluster.

    Every batch is logged on its own topic *and* on :data:`INDEX_TOPIC`, so a
    single subscription (made before the work starts) receives all topics,
    new ones included.  On attaching, the scheduler's per-topic backlogs are
    merged in; a late start loses only what the scheduler has already
    forgotten, and that loss is counted in :attr:`TopicStore.dropped`.

    Parameters
    ----------
    client : distributed.Client
    stores : dict, optional
        Where to keep topics (``topic -> TopicStore``); defaults to this
        process's stores (:func:`store`).  The server extension passes its own.
    """

    def __init__(self, client, stores: dict[str, TopicStore] | None = None) -> None:
        self.client = client
        self.stores = stores
        self._lock = threading.Lock()
        self._synced = threading.Event()
        #: set once :meth:`attach` has merged the backlog
        self.ready = threading.Event()
        self._token = uuid.uuid4().hex
        self._waiters: dict[str, threading.Event] = {}
        self._seen: set[str] = set()
        #: called with a topic name the first time this hub receives it
        self.callbacks: list[Callable[[str], None]] = []

    def store(self, topic: str) -> TopicStore:
        """The store this hub fills for ``topic``."""
        if self.stores is None:
            return store(topic)
        with self._lock:
            s = self.stores.get(topic)
            if s is None:
                s = self.stores[topic] = TopicStore(topic)
            return s

    def ingest(self, msg: Any, topic: str | None = None) -> int:
        """Add one batch message; returns how many of its reports were new."""
        if not isinstance(msg, dict) or "records" not in msg:
            return 0
        topic = topic or msg.get("topic")
        if not isinstance(topic, str):
            return 0
        n = self.store(topic).add(
            str(msg.get("source")), int(msg.get("seq", 0)), list(msg["records"]), msg.get("worker")
        )
        if topic not in self._seen:
            self._seen.add(topic)
            self._announce(topic)
        return n

    def _on_event(self, event) -> None:
        msg = event[1]
        if isinstance(msg, dict) and msg.get("sync") == self._token:
            self._synced.set()
            return
        if isinstance(msg, dict) and "sync" in msg:
            waiter = self._waiters.get(msg["sync"])
            if waiter is not None:
                waiter.set()
            return
        self.ingest(msg)

    def sync(self, timeout: float = 2.0) -> bool:
        """Wait until every report the scheduler had received when called has reached this hub.

        A marker is logged on the index topic and waited for: the scheduler
        forwards events in order.  Returns False after ``timeout`` seconds.
        """
        token = uuid.uuid4().hex
        waiter = self._waiters[token] = threading.Event()
        try:
            self.client.log_event(INDEX_TOPIC, {"sync": token})
            return waiter.wait(timeout)
        except Exception:  # a closed client: nothing more will arrive anyway
            return False
        finally:
            self._waiters.pop(token, None)

    def attach(self, timeout: float = 10.0) -> None:
        """Subscribe and merge the backlog (from any thread but the client's event loop)."""
        self.client.subscribe_topic(INDEX_TOPIC, self._on_event)
        # The subscription travels on the batched stream, the backlog request
        # on an RPC connection: wait until our own marker comes back live, so
        # nothing falls between the backlog and the live feed.
        deadline = time.monotonic() + timeout
        wait = 0.005
        while not self._synced.is_set():
            self.client.log_event(INDEX_TOPIC, {"sync": self._token})
            if self._synced.wait(wait):
                break
            wait = min(0.1, wait * 2)
            if time.monotonic() > deadline:
                logger.warning("metrics subscription not confirmed after %s s; early reports may be missing", timeout)
                break
        try:
            self.client.register_plugin(_as_worker_plugin(), name=PLUGIN_NAME)
        except Exception:  # workers without jupyter_cluster still send on the ~100 ms timer
            logger.debug("could not register the flush plugin", exc_info=True)
        backlog = self.client.get_events()
        for dask_topic, events in backlog.items():
            if dask_topic.startswith(PREFIX):
                topic = dask_topic[len(PREFIX) :]
                for _, msg in events:
                    self.ingest(msg, topic)

    def _announce(self, topic: str) -> None:
        for cb in list(self.callbacks):
            try:
                cb(topic)
            except Exception:
                logger.exception("topic callback failed")

    def detach(self) -> None:
        """Stop receiving (the stores keep what they have)."""
        try:
            self.client.unsubscribe_topic(INDEX_TOPIC)
        except Exception:
            pass


_hubs: dict[str, Hub] = {}
_hubs_lock = threading.Lock()


def attach(client=None) -> Hub:
    """Make sure this process receives every metrics topic of ``client``'s cluster.

    Idempotent and cheap after the first call.  Called automatically when a
    map starts and by :func:`metrics` / :func:`show_metrics`, so reports
    from tasks are collected from the start.

    Parameters
    ----------
    client : distributed.Client, optional
        Defaults to the current cluster's client.
    """
    if client is None:
        handle = _current_handle()
        if handle is None:
            from .errors import ClusterError

            raise ClusterError("no cluster is running in this kernel; start one with %cluster start.")
        client = handle.client
    with _hubs_lock:
        hub = _hubs.get(client.id)
        owner = hub is None
        if owner:
            hub = _hubs[client.id] = Hub(client)
    if not owner:  # another thread is attaching (e.g. at the start of a map): wait for its backlog
        hub.ready.wait(30)
        return hub
    try:
        hub.attach()
    except BaseException:
        with _hubs_lock:
            _hubs.pop(client.id, None)
        raise
    finally:
        hub.ready.set()
    return hub


def sync(timeout: float = 2.0, workers: bool = False) -> bool:
    """Wait until the reports already at the schedulers this process follows have arrived here.

    Used when a cell ends, so the live charts saved with the notebook are
    complete.

    Parameters
    ----------
    timeout : float
        Seconds to wait for each step (workers, then the scheduler).
    workers : bool
        First have every worker send the reports it still buffers (they
        leave on a ~100 ms timer, or at the end of a task; a map's direct
        batches end no task).

    Returns
    -------
    bool
        False if a worker or a scheduler did not answer in time.
    """
    with _hubs_lock:
        hubs = [h for h in _hubs.values() if h.ready.is_set()]
    ok = True
    for hub in hubs:
        if workers:
            ok = _flush_workers(hub.client, timeout) and ok
        ok = hub.sync(timeout) and ok
    return ok


async def _send_buffered(dask_worker=None) -> int:
    """On a worker (``Client.run``): send the buffered reports, returning once the scheduler has them."""
    batches = _producer.take()
    for dask_topic, msg in batches:
        if isinstance(msg, dict):
            msg.setdefault("worker", dask_worker.address)  # what the scheduler adds to a worker's stream events
        await dask_worker.scheduler.log_event(topic=dask_topic, msg=msg)
    return len(batches)


def _flush_workers(client, timeout: float) -> bool:
    from concurrent.futures import ThreadPoolExecutor
    from concurrent.futures import TimeoutError as FuturesTimeout

    pool = ThreadPoolExecutor(1, thread_name_prefix="jupyter-cluster-flush")
    try:
        pool.submit(client.run, _send_buffered, on_error="ignore").result(timeout)
        return True
    except FuturesTimeout:  # a worker whose event loop is busy: its reports come on its timer
        return False
    except Exception:  # a closing client or cluster
        logger.debug("could not flush the workers' reports", exc_info=True)
        return False
    finally:
        pool.shutdown(wait=False)


def attached(client) -> bool:
    """Whether :func:`attach` has run for ``client``."""
    return client.id in _hubs


def metrics(topic: str = "default", cluster=None):
    """What has been reported on ``topic`` so far, one row per report.

    Parameters
    ----------
    topic : str
    cluster : ClusterHandle, optional
        Whose reports to collect as well; defaults to the current cluster.

    Returns
    -------
    pandas.DataFrame or list of dict
        Columns ``step``, ``time`` (when it was reported, a UTC datetime
        column; epoch seconds in the list form), ``worker``, the identity
        fields, then one column per value (vectors hold lists).  A DataFrame when pandas is
        installed, else a list of dicts.  ``.attrs["dropped"]`` (DataFrame)
        says how many reports never arrived.

    Examples
    --------
    >>> df = jc.metrics("es")                                   # doctest: +SKIP
    >>> df.pivot_table(index="step", columns="member", values="reward")  # doctest: +SKIP
    """
    if not isinstance(topic, str):
        raise TypeError(f"metrics(): topic must be a string, not {type(topic).__name__}.")
    handle = cluster if cluster is not None else _current_handle()
    if handle is not None and not handle.closed:
        attach(handle.client)
    st = store(topic)
    rows = st.rows()
    try:
        import pandas as pd
    except ImportError:
        return rows
    df = pd.DataFrame(rows, columns=_columns(rows))
    df["time"] = pd.to_datetime(df["time"], unit="s", utc=True)
    df.attrs["topic"] = topic
    df.attrs["dropped"] = st.dropped
    return df


def _columns(rows: Iterable[dict]) -> list[str]:
    cols: dict[str, None] = {"step": None, "time": None, "worker": None}
    for r in rows:
        for k in r:
            cols.setdefault(k, None)
    return list(cols)


def _reset_for_tests() -> None:
    """Forget every store (tests only)."""
    with _stores_lock:
        _stores.clear()
