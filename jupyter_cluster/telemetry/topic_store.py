"""What a process has received on each metrics topic: :class:`TopicStore`.

A bounded history per topic (columns per series, numeric vectors as rows),
de-duplicated by the producers' sequence numbers (the wire format is described
in :mod:`.report`), downsampled into the chart model the widgets and the
sidebar draw (:meth:`TopicStore.model`).  The kernel keeps one store per topic
(:func:`store`); the Jupyter server keeps its own per cluster.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from .. import config
from ..wire.models import MetricsModel, VectorSeries, metrics_model
from .series import (
    TIME_POINTS,
    Column,
    Coverage,
    VectorColumn,
    downsample,
    downsample_rows,
    json_number,
    restored_column,
    thin,
)

logger = logging.getLogger(__name__)


def metrics_setting(key: str, default: Any) -> Any:
    """The ``jupyter-cluster.metrics.<key>`` setting, or ``default``."""
    value = config.get(f"metrics.{key}")
    return default if value is None else value


def series_key(series: dict[str, Any]) -> str:
    """The string naming a series: ``"member=3"``, ``"member=3, run=a"`` or ``"all"``."""
    if not series:
        return "all"
    return ", ".join(f"{k}={series[k]}" for k in sorted(series))


MAX_RUNS = 500
MAX_RUN_ITEMS = 5000
#: points of an item's curve per metric (thinned to every 2nd, 4th, ... point beyond), and in all per topic
CURVE_POINTS = 256
CURVE_BUDGET = 1_000_000
#: words that make a metric's best value its lowest (else its highest)
_LOWER_IS_BETTER = ("loss", "error", "err", "regret", "perplexity", "ppl", "mse", "mae", "rmse", "nll", "cost", "time")


def lower_is_better(name: str) -> bool:
    """Whether the best value of metric ``name`` is its lowest (``val_loss``, ``error``) rather than its highest."""
    low = name.lower()
    return any(w in low for w in _LOWER_IS_BETTER)


class _ItemStats:
    """What a topic keeps of one run item: its config, each scalar's last and extreme values, and its curves.

    A curve keeps every ``stride``-th report of its metric, at most
    :data:`CURVE_POINTS`; when full, every other point goes and the stride
    doubles, so it always spans the whole run.
    """

    __slots__ = ("config", "last", "low", "high", "steps", "curves")

    def __init__(self) -> None:
        self.config: dict[str, Any] = {}
        self.last: dict[str, tuple[float, float]] = {}  # name -> (step, value)
        self.low: dict[str, float] = {}
        self.high: dict[str, float] = {}
        self.steps = 0.0
        #: name -> [stride, reports seen, steps, values]
        self.curves: dict[str, list[Any]] = {}

    def add(self, x: float, vals: dict, curve_room: bool) -> int:
        """Take one report's values; returns how many curve points that added (negative: thinned)."""
        added = 0
        if x > self.steps:
            self.steps = x
        for name, v in vals.items():
            if isinstance(v, list):
                continue
            c = self.curves.get(name)
            if c is None and curve_room:
                c = self.curves[name] = [1, 0, [], []]
            if c is not None:
                if c[1] % c[0] == 0:
                    c[2].append(x)
                    c[3].append(v)
                    added += 1
                    if len(c[2]) > CURVE_POINTS:
                        before = len(c[2])
                        c[2], c[3] = c[2][::2], c[3][::2]
                        c[0] *= 2
                        added -= before - len(c[2])
                c[1] += 1
            last = self.last.get(name)
            if last is None or x >= last[0]:
                self.last[name] = (x, v)
            if v == v:  # NaN is neither best nor worst
                if v < self.low.get(name, math.inf):
                    self.low[name] = v
                if v > self.high.get(name, -math.inf):
                    self.high[name] = v
        return added

    def summary(self, curves: bool = False) -> dict[str, Any]:
        best = {k: (self.low.get(k) if lower_is_better(k) else self.high.get(k)) for k in self.last}
        out = {
            "config": dict(self.config),
            "final": {k: json_number(v) for k, (_, v) in self.last.items()},
            "best": {k: (None if b is None else json_number(b)) for k, b in best.items()},
            "steps": self.steps,
        }
        if curves:
            out["curves"] = self.curve_points()
        return out

    def curve_points(self) -> dict[str, list[list[float | None]]]:
        """Metric -> [step, value] points, by step."""
        return {k: sorted([s, json_number(v)] for s, v in zip(c[2], c[3])) for k, c in self.curves.items()}

    @classmethod
    def restore(cls, data: dict[str, Any]) -> _ItemStats:
        st = cls()
        st.config = dict(data.get("config") or {})
        steps = float(data.get("steps") or 0)
        st.steps = steps
        for k, v in (data.get("final") or {}).items():
            st.last[str(k)] = (steps, math.nan if v is None else float(v))
        for k, v in (data.get("best") or {}).items():
            if v is not None:
                (st.low if lower_is_better(str(k)) else st.high)[str(k)] = float(v)
        for k, points in (data.get("curves") or {}).items():
            pts = [(float(a), math.nan if b is None else float(b)) for a, b in points][:CURVE_POINTS]
            # thinned as it was: later reports join at a stride that keeps the span (approximately)
            st.curves[str(k)] = [1, len(pts), [a for a, _ in pts], [b for _, b in pts]]
        return st


def _run_tag(rec: dict) -> tuple[str, str] | None:
    """``(run, item key)`` of a record that carries them (wire input: checked, never trusted)."""
    run = rec.get("run")
    if not isinstance(run, str) or not run or len(run) > 64:
        return None
    item = rec.get("item")
    return run, item if isinstance(item, str) and len(item) <= 256 else ""


class TopicStore:
    """Everything this process has received on one metrics topic (bounded).

    Thread-safe: batches arrive on the Dask client's event-loop thread while
    the notebook reads from the main thread and widgets from the ticker.

    Attributes
    ----------
    topic : str
    received : int
        Reports received (after dropping duplicates).
    evicted : int
        Received reports pushed out of :meth:`rows` by the ``history`` cap
        (the oldest first); see :attr:`truncated` for the charts' points.
    version : int
        Grows with every change; cheap "has anything changed?" for renderers.
    """

    def __init__(self, topic: str, history: int | None = None, vector_history: int | None = None) -> None:
        self.topic = topic
        self.history = int(history or metrics_setting("history", 100_000))
        self.vector_history = int(vector_history or metrics_setting("vector-history", 5_000))
        self._lock = threading.RLock()
        self._rows: deque[tuple] = deque(maxlen=self.history)
        self.series: dict[str, dict] = {}
        self.scalars: dict[str, dict[str, Column]] = {}
        self.vectors: dict[str, dict[str, VectorColumn]] = {}
        self._coverage: dict[str, Coverage] = {}
        self._counts: dict[str, int] = {}
        self._columns: dict[tuple[str, str], Any] = {}
        #: series key -> step and report time (the charts' time axes)
        self._times: dict[str, Column] = {}
        self._last_series: tuple[dict, str] | None = None
        #: run -> item key ("" for the run itself) -> its config, final/best values and curves
        self._runs: dict[str, dict[str, _ItemStats]] = {}
        self._curve_points = 0
        self.received = 0
        self.evicted = 0
        #: points a restored snapshot's curves had already lost (see :meth:`restore`)
        self._truncated_before = 0
        self.version = 0
        self._listeners: list[Callable[[TopicStore, list[dict]], None]] = []

    # -- input -------------------------------------------------------------------
    def add(self, source: str, seq: int, records: list[dict], worker: str | None = None) -> int:
        """Add a batch of ``records`` numbered ``seq, seq+1, ...`` by ``source``; return how many were new."""
        added: list[dict] = []
        with self._lock:
            cov = self._coverage.setdefault(source, Coverage())
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
        item = rec.get("item") if not ident else None
        if item and isinstance(item, str):
            # a sweep item's reports are its series, named by its config ("lr=0.001, seed=0"), as its
            # table row is: one saw-tooth of every item's steps otherwise
            ident = {"item": item}
        last = self._last_series
        if last is not None and (ident is last[0] or ident == last[0]):
            key = last[1]  # consecutive reports of one series: skip building the key
        elif item and isinstance(item, str):
            key = item
            if key not in self.series:
                self.series[key] = dict(ident)
            self._last_series = (ident, key)
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
                    col = columns[(name, key)] = self.vectors.setdefault(name, {})[key] = VectorColumn(
                        self.vector_history
                    )
                col.add(x, v)
            else:
                if col is None:
                    col = columns[(name, key)] = self.scalars.setdefault(name, {})[key] = Column()
                col.add(x, float(v), self.history)
        t = rec.get("time")
        if isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t):
            tcol = self._times.get(key)
            if tcol is None:
                tcol = self._times[key] = Column()
            tcol.add(x, float(t), self.history)
        if "run" in rec:
            self._run_item(rec, x, vals)
        if len(self._rows) == self.history:  # the deque drops its oldest row
            self.evicted += 1
        self._rows.append((step, t, worker, key, vals))

    def _run_item(self, rec: dict, x: float, vals: dict) -> None:
        tag = _run_tag(rec)
        if tag is None:
            return
        run, key = tag
        items = self._runs.get(run)
        if items is None:
            if len(self._runs) >= MAX_RUNS:
                gone = self._runs.pop(next(iter(self._runs)))
                self._curve_points -= sum(len(c[2]) for st in gone.values() for c in st.curves.values())
            items = self._runs[run] = {}
        st = items.get(key)
        if st is None:
            if len(items) >= MAX_RUN_ITEMS:
                return
            st = items[key] = _ItemStats()
        config = rec.get("config")
        if isinstance(config, dict):
            for k, v in list(config.items())[:64]:
                if isinstance(k, str) and (v is None or isinstance(v, (bool, int, float, str))):
                    st.config[k] = v if not isinstance(v, str) else v[:200]
        self._curve_points += st.add(x, vals, self._curve_points < CURVE_BUDGET)

    def run_items(self, runs: set[str] | None = None, curves: bool = False) -> dict[str, dict[str, dict[str, Any]]]:
        """``run -> item key -> {"config", "final", "best", "steps"}`` for the runs reported on this topic.

        ``final`` is each scalar's value at its highest step, ``best`` its
        lowest for loss-like names (:func:`lower_is_better`), else its highest.
        With ``curves``, also ``"curves"``: metric -> [step, value] points
        (at most :data:`CURVE_POINTS`, spread over the whole run).
        """
        with self._lock:
            return {
                run: {key: st.summary(curves) for key, st in items.items()}
                for run, items in self._runs.items()
                if runs is None or run in runs
            }

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

    @property
    def truncated(self) -> int:
        """Points the curves lost from their start to the ``history`` cap, summed over values and series.

        Each value of each series keeps its newest ``history`` points
        (``vector-history`` rows for vectors); the charts of a topic with
        ``truncated > 0`` do not reach back to its first reports.
        """
        with self._lock:
            scalar = sum(c.cut for cols in self.scalars.values() for c in cols.values())
            vector = sum(c.cut for vcols in self.vectors.values() for c in vcols.values())
            return self._truncated_before + scalar + vector

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

    def model(
        self, max_points: int | None = None, max_cells: int | None = None, per_series_points: int = 4000
    ) -> MetricsModel:
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
        max_points = int(max_points or metrics_setting("chart-points", 20_000))
        max_cells = int(max_cells or metrics_setting("chart-cells", 200_000))
        with self._lock:
            scalars: dict[str, dict[str, list]] = {}
            for name, cols in self.scalars.items():
                cap = max(50, min(per_series_points, max_points // max(1, len(cols))))
                out = scalars[name] = {}
                for key, col in cols.items():
                    if col.cache is None or col.cache[:2] != (col.version, cap):
                        col.cache = (col.version, cap, downsample(col.steps, col.values, cap))
                    out[key] = col.cache[2]
            vectors: dict[str, dict[str, VectorSeries]] = {}
            for name, vcols in self.vectors.items():
                width = max((len(c.rows[-1]) for c in vcols.values() if c.rows), default=1) or 1
                cap = max(10, max_cells // (width * max(1, len(vcols))))
                vout = vectors[name] = {}
                for key, vcol in vcols.items():
                    if vcol.cache is None or vcol.cache[:2] != (vcol.version, cap):
                        vcol.cache = (vcol.version, cap, downsample_rows(vcol.steps, vcol.rows, cap))
                    vout[key] = vcol.cache[2]
            times: dict[str, list[list[float]]] = {}
            # shared by the series like a chart's points, at most TIME_POINTS each (interpolated between)
            tcap = max(20, min(TIME_POINTS, max_points // (4 * max(1, len(self._times)))))
            for key, tcol in self._times.items():
                if tcol.cache is None or tcol.cache[:2] != (tcol.version, tcap):
                    tcol.cache = (tcol.version, tcap, thin(tcol.steps, tcol.values, tcap))
                times[key] = tcol.cache[2]
            return metrics_model(
                self.topic,
                scalars,
                vectors,
                sum(c.high - c.covered for c in self._coverage.values()),
                self.received,
                times,
                self.truncated,
            )

    # -- kept across a restart of the process that holds it ----------------------------
    def snapshot(self, **model_args: Any) -> dict[str, Any]:
        """What :meth:`restore` needs, as JSON: the downsampled model, the series and which reports arrived.

        The Jupyter server writes it for running clusters, so that a server
        restart keeps their curves (the scheduler's backlog holds only the
        last events).  The points are those of :meth:`model` with
        ``model_args`` (bounded); the raw report rows (:meth:`rows`) are not kept.
        """
        with self._lock:
            return {
                "format": 1,
                "model": self.model(**model_args),
                "series": {k: dict(v) for k, v in self.series.items()},
                "coverage": {src: [[a, b] for a, b in c.intervals] for src, c in self._coverage.items()},
                "high": {src: c.high for src, c in self._coverage.items()},
                "runs": self.run_items(curves=True),
            }

    @classmethod
    def restore(cls, snap: dict[str, Any]) -> TopicStore:
        """A store holding a :meth:`snapshot`'s points, which drops the reports it had already seen.

        Raises
        ------
        ValueError
            When ``snap`` is not a snapshot (a damaged file).
        """
        try:
            model = snap["model"]
            store = cls(str(model["topic"]))
            store.series = {str(k): dict(v) for k, v in (snap.get("series") or {}).items()}
            for name, by_series in (model.get("scalars") or {}).items():
                for key, points in by_series.items():
                    col = restored_column(points)
                    store.scalars.setdefault(name, {})[key] = store._columns[(name, key)] = col
                    store._counts[key] = max(store._counts.get(key, 0), col.count)
            for name, by_series in (model.get("vectors") or {}).items():
                for key, vs in by_series.items():
                    vcol = VectorColumn(store.vector_history)
                    for step, row in zip(vs["steps"], vs["rows"]):
                        vcol.add(float(step), [math.nan if x is None else float(x) for x in row])
                    store.vectors.setdefault(name, {})[key] = store._columns[(name, key)] = vcol
                    store._counts[key] = max(store._counts.get(key, 0), vcol.count)
            for key, pairs in (model.get("times") or {}).items():
                store._times[key] = restored_column(pairs)
            for src, intervals in (snap.get("coverage") or {}).items():
                cov = Coverage()
                cov.intervals = [(int(a), int(b)) for a, b in intervals]
                cov.covered = sum(b - a for a, b in cov.intervals)
                cov.high = max(int((snap.get("high") or {}).get(src, 0)), max((b for _, b in cov.intervals), default=0))
                store._coverage[str(src)] = cov
            for run, items in (snap.get("runs") or {}).items():
                store._runs[str(run)] = {str(k): _ItemStats.restore(v) for k, v in items.items()}
                store._curve_points += sum(
                    len(c[2]) for st in store._runs[str(run)].values() for c in st.curves.values()
                )
            store.received = int(model.get("received") or 0)
            store._truncated_before = int(model.get("truncated") or 0)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"not a metrics snapshot: {exc}") from None
        store.version = 1
        return store

    def summary(self) -> str:
        """A few lines of plain text: per value, the latest value of each series."""
        with self._lock:
            lines = [
                f"metrics {self.topic!r}: {self.received} reports, {len(self.series)} series, {self.dropped} dropped"
            ]
            if self.evicted:
                lines[0] += f", {self.evicted} evicted (only the newest {self.history} are kept)"
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


#: downsampling of a topic for the sidebar and for what the server keeps of it (narrower than a notebook cell)
PANEL_MODEL = {"max_points": 4000, "max_cells": 40_000, "per_series_points": 1000}

_stores: dict[str, TopicStore] = {}
_stores_lock = threading.Lock()


def store(topic: str) -> TopicStore:
    """This process's :class:`TopicStore` for ``topic`` (created empty if new)."""
    with _stores_lock:
        s = _stores.get(topic)
        if s is None:
            s = _stores[topic] = TopicStore(topic)
        return s


def all_stores() -> list[TopicStore]:
    """Every topic store of this process."""
    with _stores_lock:
        return list(_stores.values())


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
