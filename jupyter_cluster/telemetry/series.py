"""One topic's series as columns: arrival coverage per producer, numeric columns and vector rows, downsampling.

The parts :class:`.topic_store.TopicStore` keeps per series and the
downsampling that turns them into the chart model's points.
"""

from __future__ import annotations

import bisect
import math
from array import array
from collections import deque
from typing import Any

from ..wire.models import VectorSeries


class Coverage:
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


class Column:
    """One scalar value of one series: steps and values, kept sorted by step."""

    __slots__ = ("steps", "values", "count", "cut", "version", "cache")

    def __init__(self) -> None:
        self.steps = array("d")
        self.values = array("d")
        self.count = 0  # points ever added (x for reports without a step)
        self.cut = 0  # points evicted from the start by the history cap
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
            cut = max(1, limit // 10)  # a tenth at once: deleting from an array's start moves the rest
            del self.steps[:cut]
            del self.values[:cut]
            self.cut += cut


class VectorColumn:
    """One vector value of one series: a row per step."""

    __slots__ = ("steps", "rows", "count", "cut", "version", "cache")

    def __init__(self, limit: int) -> None:
        self.steps: deque[float] = deque(maxlen=limit)
        self.rows: deque[list[float]] = deque(maxlen=limit)
        self.count = 0
        self.cut = 0  # rows evicted from the start by the history cap
        self.version = 0
        self.cache: tuple | None = None

    def add(self, step: float, row: list[float]) -> None:
        if len(self.steps) == self.steps.maxlen:  # the deque drops its oldest row (also when sorting it in)
            self.cut += 1
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


#: runs a topic keeps item summaries of (oldest dropped first), and items per run
def json_number(x: float) -> float | None:
    return x if math.isfinite(x) else None


def downsample(steps: array, values: array, cap: int) -> list[list]:
    """At most ~``cap`` points that keep each bucket's minimum and maximum (peaks survive)."""
    n = len(steps)
    if n <= cap:
        return [[s, json_number(v)] for s, v in zip(steps, values)]
    buckets = max(1, cap // 2)
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy comes with pandas in practice
        stride = -(-n // cap)
        picks = list(range(0, n, stride))
        if picks[-1] != n - 1:
            picks.append(n - 1)
        return [[steps[i], json_number(values[i])] for i in picks]
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


#: [step, time] pairs per series in a chart model (the time axes interpolate between them)
TIME_POINTS = 1000


def thin(steps: array, times: array, cap: int) -> list[list[float]]:
    """At most ~``cap`` evenly spaced [step, time] pairs, the first and last always kept."""
    n = len(steps)
    stride = max(1, -(-n // cap))
    idx = list(range(0, n, stride))
    if n and idx[-1] != n - 1:
        idx.append(n - 1)
    return [[steps[i], times[i]] for i in idx]


def restored_column(points: list[list[Any]]) -> Column:
    """A scalar column from a model's [step, value] points (None: not a number).

    The points come from a snapshot file's JSON, so nothing is known of their
    types until ``float`` has checked them (a damaged file raises there).
    """
    col = Column()
    for step, value in points:
        col.add(float(step), math.nan if value is None else float(value), 1 << 62)
    col.version = 1
    return col


def downsample_rows(steps: deque, rows: deque, cap: int) -> VectorSeries:
    """At most ``cap`` rows: consecutive rows are averaged in equal buckets."""
    n = len(steps)
    if n <= cap:
        return {"steps": list(steps), "rows": [[json_number(x) for x in r] for r in rows]}
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
