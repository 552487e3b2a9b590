"""Metrics reported from tasks or the notebook: validation, batching and sending.

Reports travel over Dask's own event topics, so they cross machines without a
new server::

    task: report(step=..., reward=...)   ─► per-process buffer (flushed every ~100 ms
                                             and at the end of every task)
          ─► Worker.log_event("jupyter-cluster:metrics:<topic>", batch)
          ─► scheduler (keeps only the last ``events-log-length`` events per topic)
          ─► kernel / Jupyter server: hub.Hub ─► store.TopicStore ─► widgets, sidebar

Wire format
-----------
Every event on ``jupyter-cluster:metrics:<topic>`` is one *batch*::

    {"topic": "<topic>", "source": "<producer id>", "seq": 17, "records": [record, ...], "worker": addr}

where ``seq`` numbers the batch's first record among everything that producer
sent on that topic (records are numbered 0, 1, 2, ... per producer and topic),
and each record is ``{"step": int|None, "time": float, "series": {...},
"values": {...}}``.  :func:`.store.records` expands a batch into the flat record dicts
of the shared interface (``topic`` and ``worker`` filled in).  The numbering
lets a subscriber drop duplicates (live stream vs. the scheduler's backlog) and
count exactly what it never got (:attr:`.store.TopicStore.dropped`).

Each batch (which also carries ``"topic"``) is logged on its own topic *and*
on ``jupyter-cluster:metrics``, so one subscription made before the work
starts receives every topic, new ones included, while each topic keeps its
own backlog on the scheduler for late subscribers (see :mod:`.hub`).
"""

from __future__ import annotations

import logging
import numbers
import os
import threading
import time
import uuid
import weakref
from typing import Any, Protocol

from distributed import Client, WorkerPlugin

from . import job_log
from .tags import tag_record as _tag_record
from .topic_names import INDEX_TOPIC, JOBS_TOPIC, PLUGIN_NAME, topic_name
from .topic_store import metrics_setting

logger = logging.getLogger(__name__)

#: records per batch on the wire; bigger buffers are split so no single message is huge
MAX_BATCH = 5000
#: longest numeric vector a single value may hold
MAX_VECTOR = 65536

_DEFAULT_IDENTITY = ("member", "run", "trial", "rank", "replica", "seed", "agent", "actor", "env", "expert_group")


def identity_fields() -> frozenset[str]:
    """Names whose numeric values identify a series rather than being measured.

    String values always identify a series; integers identify one only when
    their name is listed in ``jupyter-cluster.metrics.identity-fields``
    (e.g. ``member``, ``run``, ``trial``) or passed through ``series=``.
    """
    global _identity_cache
    now = time.monotonic()
    if _identity_cache is None or now - _identity_cache[0] > 1.0:  # report() may run 10^4 times a second
        _identity_cache = (now, frozenset(metrics_setting("identity-fields", _DEFAULT_IDENTITY)))
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
            out: list[tuple[list[str], Any]] = []
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

    def forked(self) -> None:
        """In a forked child: a producer of its own.

        Local workers are forked from a fork server that may have imported this
        module: a shared ``source`` would make the stores drop one worker's
        reports as the other's duplicates, and buffered reports would be sent twice.
        """
        self.__init__()  # type: ignore[misc]


_producer = _Producer()
os.register_at_fork(after_in_child=_producer.forked)


def _flush_interval() -> float:
    from dask.utils import parse_timedelta

    return float(parse_timedelta(metrics_setting("flush-interval", "100ms")))


def current_worker():
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
        # the scheduler names the sender of events on a worker's stream only; an RPC's it cannot tell
        msg["worker"] = worker.address
        try:
            await worker.scheduler.log_event(topic=dask_topic, msg=msg)
        except Exception:  # a scheduler that went away: the subscriber counts the gap
            logger.debug("could not send metrics batch on %s", dask_topic, exc_info=True)


def _arm_worker_flush(worker) -> None:
    def arm() -> None:
        worker.loop.call_later(_flush_interval(), _flush_on_worker, worker)

    worker.loop.add_callback(arm)


class FlushPlugin(WorkerPlugin):
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


def flush_plugin() -> FlushPlugin:
    """The worker plugin that flushes a worker's reports at the end of each task."""
    return FlushPlugin()


class KernelSink(Protocol):
    """Where reports made in the notebook go: the kernel's side of :func:`report` (see :mod:`.kernel`).

    This module is the producer alone (it also runs on every worker); the
    session layer, which knows the kernel's current cluster, installs the
    sink with :func:`set_kernel_sink`.
    """

    def add(self, topic: str, seq: int, record: dict, arm: bool) -> None: ...

    def flush(self) -> bool: ...

    def handle(self) -> Any: ...


#: the kernel's sink (None in a process without the notebook side, e.g. a worker)
_kernel_sink: KernelSink | None = None


def set_kernel_sink(sink: KernelSink | None) -> None:
    """Install where the notebook's own reports go (called by :mod:`jupyter_cluster.cluster.session`)."""
    global _kernel_sink
    _kernel_sink = sink


def current_handle() -> Any:
    """The kernel's current cluster handle as the sink knows it, or None (none, closed, or no sink)."""
    sink = _kernel_sink
    if sink is None:
        return None
    try:
        h = sink.handle()
    except Exception:
        return None
    return None if h is None or h.closed else h


def report(
    step: int | None = None,
    topic: str = "default",
    *,
    series: dict | None = None,
    config: dict | None = None,
    **values: Any,
) -> None:
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
    config : dict, optional
        Hyperparameters of the run (or ``%%parallel`` item) this report
        belongs to, added to its config in :func:`jupyter_cluster.runs` and
        the panel's sweep table (see :mod:`jupyter_cluster.tracking.table`); outside
        a sweep item or a ``jc.run()`` block it is not kept.

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
    _tag_record(record, config)  # which run / sweep item it belongs to (run_tags.py)
    worker = current_worker()
    seq, arm = _producer.add(topic, record)
    if worker is not None:
        if arm:
            _arm_worker_flush(worker)
        return
    # in the notebook: visible at once here, published for the sidebar and other kernels
    sink = _kernel_sink
    if sink is not None:
        sink.add(topic, seq, record, arm)
    else:  # no notebook side in this process: nothing would ever send the buffer
        _producer.take(discard=True)


def publish(client: Client, dask_topic: str | list[str], msg: Any) -> None:
    """Log ``msg`` on ``dask_topic`` through ``client`` without blocking; order is kept.

    Used for kernel-side metric batches and for job progress
    (:data:`JOBS_TOPIC`).  Failures (a scheduler that went away) are logged
    at debug level and otherwise ignored.
    """
    state = _publishers.setdefault(client, {"lock": None})

    async def send() -> None:
        import asyncio

        if state["lock"] is None:
            state["lock"] = asyncio.Lock()
        async with state["lock"]:
            try:
                scheduler = client.scheduler
                assert scheduler is not None  # a connected client
                if dask_topic == JOBS_TOPIC and isinstance(msg, dict) and "items" in msg:
                    await job_log.ensure(client)  # the scheduler's log keeps the newest sweeps' items only
                await scheduler.log_event(topic=dask_topic, msg=msg)
            except Exception:
                logger.debug("could not publish on %s", dask_topic, exc_info=True)

    try:
        loop = client.loop
        assert loop is not None  # a client that has started
        loop.add_callback(send)
    except Exception:  # a closed client
        logger.debug("client closed; %s message not published", dask_topic)


#: each client's send lock (order is kept per client); an entry goes with its client (weak keys) or
#: at drain(), so that a kernel starting and stopping many clusters does not keep one per client it had
_publishers: weakref.WeakKeyDictionary[Client, dict] = weakref.WeakKeyDictionary()


def drain(client: Client, timeout: float = 5.0) -> None:
    """Wait until the messages :func:`publish` queued on ``client`` have reached the scheduler.

    A cluster's owner calls it before stopping the cluster, so that a map's
    last job message is not cut off by the client's close.
    """
    # Kept, not popped: a stop that fails after this must not start a second lock (and so a
    # second order) for the same client; the entry goes with the client (a weak key).
    state = _publishers.get(client)
    if state is None or client.status != "running":
        return

    async def wait() -> None:
        if state["lock"] is not None:
            async with state["lock"]:  # a FIFO lock: held after every send queued before
                pass

    try:
        client.sync(wait, callback_timeout=timeout)
    except Exception:  # a scheduler that went away: nothing more reaches it
        logger.debug("could not drain the messages of %s", client.id, exc_info=True)


def flush() -> None:
    """Send this process's buffered reports now (normally done every ~100 ms)."""
    worker = current_worker()
    if worker is not None:
        worker.loop.add_callback(_flush_on_worker, worker)
    elif _kernel_sink is not None:
        _kernel_sink.flush()
    else:
        _producer.take(discard=True)


async def send_buffered(dask_worker=None) -> int:
    """On a worker (``Client.run``): send the buffered reports, returning once the scheduler has them."""
    batches = _producer.take()
    for dask_topic, msg in batches:
        if isinstance(msg, dict):
            msg.setdefault("worker", dask_worker.address)  # what the scheduler adds to a worker's stream events
        await dask_worker.scheduler.log_event(topic=dask_topic, msg=msg)
    return len(batches)
