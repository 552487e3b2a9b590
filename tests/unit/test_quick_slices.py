"""A chunk of quick items runs in slices (engine/worker/slices.py): as fast as ``map``, and each item
still gets its own value, error, output and duration; the budget still stops the chunk.

``run_chunk`` runs here in-process (no Dask needed)."""

from __future__ import annotations

import sys
import threading
import time

import cloudpickle

from jupyter_cluster.engine.protocol import MapRun
from jupyter_cluster.engine.worker import run as worker_run
from jupyter_cluster.engine.worker import slices
from jupyter_cluster.engine.worker.items import ItemsRun


def inc(x):
    return x + 1


def picky(x):
    if x % 1000 == 500:
        print("bad", x)
        raise ValueError(x)
    if x % 1000 == 900:
        print("odd", x)
    return x * 2


def add(a, b):
    return a + b


def _chunk(fn, items, star=False, capture=True, budget=None):
    run = MapRun(f"slices-{fn.__name__}-{id(items)}", cloudpickle.dumps(fn), star, 0, None, capture)
    return worker_run.run_chunk(run, items, budget=budget)


def test_quick_items_cost_about_what_map_costs():
    """Before: about 1 µs per item in the per-item loop, 10-12x ``map``'s own cost on a no-op."""
    items = list(range(200_000))
    _chunk(inc, items[:100])  # the function's load is not timed

    def best(fn):
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    plain = best(lambda: list(map(inc, items)))
    ours = best(lambda: _chunk(inc, items))
    assert ours < 6 * plain, f"run_chunk {ours:.3f} s against map {plain:.3f} s for {len(items):,} items"


def test_errors_outputs_and_durations_stay_per_item(monkeypatch):
    # In-process: wrap the stdout pytest has now (a worker process wraps its own once), and restore it after.
    monkeypatch.setattr(sys, "stdout", sys.stdout)
    monkeypatch.setattr(sys, "stderr", sys.stderr)
    monkeypatch.setattr(worker_run._STATE, "streams_installed", False)
    items = list(range(5_000))
    values, timings, outputs, errors, _worker, _started = _chunk(picky, items)
    failing = [x for x in items if x % 1000 == 500]
    assert sorted(errors) == failing
    assert all(type(errors[p][0]) is ValueError and errors[p][0].args == (p,) for p in failing)
    assert values == [None if x in failing else x * 2 for x in items]
    # Every item is timed, in runs of (items, seconds each): one per slice, not one float per item.
    assert sum(n for n, _ in timings) == len(items) and all(d >= 0 for _, d in timings)
    assert len(timings) < len(items) / 50
    expected = {x: f"bad {x}\n" for x in failing} | {x: f"odd {x}\n" for x in items if x % 1000 == 900}
    assert outputs == expected


def test_starred_items_in_slices_without_capture():
    items = [(x, 1) for x in range(1_000)]
    values, timings, outputs, errors, *_ = _chunk(add, items, star=True, capture=False)
    assert values == [x + 1 for x in range(1_000)] and outputs is None and errors is None


def test_the_budget_and_a_stop_still_end_a_chunk_of_quick_items():
    items = list(range(50_000_000))  # far more than fits in the budget
    t0 = time.perf_counter()
    values, timings, *_ = _chunk(inc, items, budget=0.05)
    assert time.perf_counter() - t0 < 10
    assert slices.FIRST_ITEMS < len(values) < len(items) and sum(n for n, _ in timings) == len(values)
    assert values[: len(values)] == list(range(1, len(values) + 1))

    stop = threading.Event()
    run = ItemsRun(inc, items, stop=stop, capture=False, error_info=worker_run.error_info)
    timer = threading.Timer(0.05, stop.set)
    timer.start()
    try:
        slices.run_slices(run, 1e-7)
    finally:
        timer.cancel()
    values = run.values
    assert 0 < len(values) < len(items) and values[-1] == len(values)
