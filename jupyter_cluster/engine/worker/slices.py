"""The rest of a chunk of quick items, run in slices: ``values.extend(map(fn, slice))``.

The per-item loop of :func:`.run.run_chunk` costs about 1 µs per item (a clock
read before and after, a capture buffer, the retry loop), ten times a trivial
function's own cost: a map of 10^6 such items spent most of its time there.
Once a chunk's first items show that its items are quick
(:data:`QUICK_ITEM_SECONDS`), the rest runs here, where an item costs what
``map`` costs, and everything the per-item loop gives is still given:

- a failing item's error is kept for that item, and the items after it run;
- what an item prints is filed under that item, by the same capture as the
  per-item loop's (:class:`.items.ItemOutputs`: the running item's position
  is ``len(values)`` when something is written);
- the budget, a stop (``Pool.terminate``) and a cancelled map are checked
  between slices of about :data:`SLICE_SECONDS`;
- a slice's items are timed as one run, ``(items, mean seconds)`` (the planner uses means only).

Not used with retries or a per-item timeout (each needs the per-item loop).
A callable that names the function it would call for each item
(``fn.direct_call()``: a ``Pool``'s task) has its items passed to that function.
"""

from __future__ import annotations

import time
from itertools import starmap

from .items import ItemsRun

#: Items the per-item loop runs (and times) first, before a chunk may switch to slices.
FIRST_ITEMS = 8
#: Mean seconds per item under which the rest of a chunk runs in slices.
QUICK_ITEM_SECONDS = 20e-6
#: Work per slice aimed at, in seconds (stop, budget and cancellation are checked this often).
SLICE_SECONDS = 0.005
#: Most items in one slice.
MAX_SLICE_ITEMS = 65_536


def run_slices(chunk: ItemsRun, per_item: float) -> None:
    """Run ``chunk.items[len(chunk.values):]``, appending as the per-item loop does (see the module's text).

    ``per_item`` is the mean seconds per item measured so far.  What the
    items print goes where the per-item loop sends it: the chunk's one
    :class:`.items.ItemOutputs`, set as the thread's capture by the caller,
    files each write under the running item (``len(values)``).
    """
    perf = time.perf_counter
    fn, items, star, stop = chunk.fn, chunk.items, chunk.star, chunk.stop
    # A wrapper that only calls a function (a Pool's task) names it: map() calls that directly, not
    # the wrapper's Python __call__ per item (3.6x a trivial function's own cost).
    direct = getattr(fn, "direct_call", None)
    if direct is not None and not star:
        found = direct()
        if found is not None:
            fn, star = found
    values, timings, errors = chunk.values, chunk.timings, chunk.errors
    n = len(items)
    size = _slice_items(per_item)
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
                errors[len(values)] = chunk.error_info(exc)
                values.append(None)
                if stop is not None and stop.is_set():
                    stopped = True
                    break
        t1 = perf()
        done = len(values) - pos
        if done:
            mean = (t1 - t0) / done
            timings.append((done, mean))  # one run per slice: its items' mean
            size = _slice_items(mean)
        if stopped or t1 >= chunk.deadline:
            break
        if t1 >= chunk.next_check:
            chunk.next_check = t1 + 0.05
            if chunk.cancelled():
                break


def _slice_items(per_item: float) -> int:
    return int(max(1, min(SLICE_SECONDS / max(per_item, 1e-8), MAX_SLICE_ITEMS)))
