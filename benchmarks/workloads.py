"""Item functions and inputs shared by every system in the benchmarks.

This module is importable on every worker of every system (the benchmark puts
its directory on ``PYTHONPATH``), so all systems receive the same functions by
reference and pay the same (tiny) cost to ship them.  Only the standard
library is imported at module level: the peers' own virtual environment may
lack numpy.
"""

from __future__ import annotations

import os
import random
import time


def identity(x):
    """The no-op item."""
    return x


def sleep_item(seconds):
    """An I/O-like item: sleeps, returns its argument."""
    time.sleep(seconds)
    return seconds


def started_at(_):
    """The wall-clock time at which the item started (``first_item.py``'s latency probe)."""
    return time.time()


def spin(loops):
    """A CPU-bound item: a pure-Python loop (about 10 ms for the calibrated count)."""
    acc = 0
    for i in range(loops):
        acc += i
    return loops


def run_batch(fn, batch, **kwargs):
    """Hand-chunking for the peers' ``+50`` variants: one task runs many items."""
    return [fn(x, **kwargs) for x in batch]


def calibrate_spin(target_s: float = 0.01, rounds: int = 5) -> int:
    """Loops of :func:`spin` that take ``target_s`` here (best of ``rounds``)."""
    loops = 20_000
    while True:
        t0 = time.perf_counter()
        spin(loops)
        if time.perf_counter() - t0 > 0.002:
            break
        loops *= 2
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        spin(loops)
        best = min(best, time.perf_counter() - t0)
    return max(1, int(loops * target_s / best))


def heavy_tailed_durations(n: int, mean: float = 0.01, sigma: float = 1.5, seed: int = 7) -> list[float]:
    """``n`` lognormal sleep durations with the given mean (a few items last 20–50× the mean).

    Seeded, so every system gets the same durations in the same order.
    """
    import math

    rng = random.Random(seed)
    mu = math.log(mean) - sigma * sigma / 2  # mean of lognormal = exp(mu + sigma^2/2)
    return [rng.lognormvariate(mu, sigma) for _ in range(n)]


# -- the captured large array ----------------------------------------------------------
class Payload:
    """A large numpy array that leaves a mark each time it is unpickled.

    Unpickling appends the process id to ``count_path``; the benchmark counts
    the lines to know how many times the array crossed a process boundary
    (one transfer = one deserialisation), whatever the system's transport.
    """

    def __init__(self, nbytes: int, count_path: str):
        import numpy as np

        self.arr = np.arange(nbytes // 8, dtype=np.float64)
        self.count_path = count_path

    def __getstate__(self):
        return {"arr": self.arr, "count_path": self.count_path}

    def __setstate__(self, state):
        self.__dict__.update(state)
        with open(state["count_path"], "a") as f:
            f.write(f"{os.getpid()}\n")


def make_lookup(payload: Payload):
    """An item function that captures ``payload`` in its closure (as a notebook lambda would)."""
    arr = payload

    def lookup(i):
        return float(arr.arr[(i * 9973) % len(arr.arr)])

    return lookup


def lookup_in(i, payload):
    """The same lookup with the payload passed explicitly (Dask's scatter idiom)."""
    return float(payload.arr[(i * 9973) % len(payload.arr)])


def deserialisations(count_path: str) -> list[int]:
    """Process ids that unpickled the payload, one entry per unpickling."""
    try:
        with open(count_path) as f:
            return [int(line) for line in f if line.strip()]
    except OSError:
        return []
