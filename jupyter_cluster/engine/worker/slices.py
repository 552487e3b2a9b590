"""The rest of a chunk of quick items, run in slices: ``values.extend(map(fn, slice))``.

The per-item loop of :func:`.run.run_chunk` costs about 1 µs per item (a clock
read before and after, a capture buffer, the retry loop), ten times a trivial
function's own cost: a map of 10^6 such items spent most of its time there.
Once a chunk's first items show that its items are quick
(:data:`QUICK_ITEM_SECONDS`), the rest runs here, where an item costs what
``map`` costs, and everything the per-item loop gives is still given:

- a failing item's error is kept for that item, and the items after it run;
- what an item prints is filed under that item (the capture looks up the
  running item's position as ``len(values)`` when something is written);
- the budget, a stop (``Pool.terminate``) and a cancelled map are checked
  between slices of about :data:`SLICE_SECONDS`;
- each item's duration is its slice's mean (the planner uses means only).

Not used with retries or a per-item timeout (each needs the per-item loop).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from itertools import starmap
from typing import Any

#: Items the per-item loop runs (and times) first, before a chunk may switch to slices.
FIRST_ITEMS = 8
#: Mean seconds per item under which the rest of a chunk runs in slices.
QUICK_ITEM_SECONDS = 20e-6
#: Work per slice aimed at, in seconds (stop, budget and cancellation are checked this often).
SLICE_SECONDS = 0.005
#: Most items in one slice.
MAX_SLICE_ITEMS = 65_536


class _Positioned:
    """A slice's capture: each write goes to the buffer of the item running then (``len(values)``)."""

    __slots__ = ("values", "captures", "make")

    def __init__(self, values: list, make: Callable[[], Any]):
        self.values = values
        self.captures: dict[int, Any] = {}
        self.make = make

    def write(self, s: str) -> int:
        pos = len(self.values)
        cap = self.captures.get(pos)
        if cap is None:
            cap = self.captures[pos] = self.make()
        return cap.write(s)


def run_slices(
    fn: Callable,
    items: list,
    star: bool,
    per_item: float,
    capture: Callable[[], Any] | None,
    local: threading.local,
    cancelled: Callable[[], bool],
    next_check: float,
    deadline: float,
    stop: threading.Event | None,
    values: list,
    durations: list,
    outputs: dict,
    errors: dict,
    error_info: Callable[[BaseException], tuple],
) -> None:
    """Run ``items[len(values):]``, appending as the per-item loop does (see the module's text).

    ``capture`` makes one item's capture buffer (None: output is not captured);
    ``per_item`` is the mean seconds per item measured so far.
    """
    perf = time.perf_counter
    n = len(items)
    size = _slice_items(per_item)
    positioned = _Positioned(values, capture) if capture is not None else None
    local.buf = positioned
    try:
        while len(values) < n:
            if stop is not None and stop.is_set():  # Pool.terminate(): the rest of the chunk is not run
                break
            pos = len(values)
            part = items[pos : pos + size]
            t0 = perf()
            calls = starmap(fn, part) if star else map(fn, part)
            stopped = False
            while True:
                try:
                    values.extend(calls)  # what ran before a failure stays in values
                    break
                except BaseException as exc:  # noqa: BLE001 - every item failure is data
                    errors[len(values)] = error_info(exc)
                    values.append(None)
                    if stop is not None and stop.is_set():
                        stopped = True
                        break
            t1 = perf()
            done = len(values) - len(durations)
            if done:
                mean = (t1 - t0) / done
                durations.extend([mean] * done)
                size = _slice_items(mean)
            if stopped or t1 >= deadline:
                break
            if t1 >= next_check:
                next_check = t1 + 0.05
                if cancelled():
                    break
    finally:
        local.buf = None
        if positioned is not None:
            for pos, cap in positioned.captures.items():
                text = cap.getvalue()
                if text:
                    outputs[pos] = text


def _slice_items(per_item: float) -> int:
    return int(max(1, min(SLICE_SECONDS / max(per_item, 1e-8), MAX_SLICE_ITEMS)))
