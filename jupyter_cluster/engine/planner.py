"""Batch sizing: how many items the next batch of a map carries, and its time budget.

Pure functions of what a map knows (no Dask, no I/O), so they are tested
without a cluster.

The policy
----------
Until a duration is known, batches are *probes*: up to :data:`PROBE_ITEMS`
items (fewer for large items, :func:`probe_items`) with a budget of
:data:`PROBE_BUDGET_SECONDS`; the worker stops at the budget and the items
left over come back to be re-batched.  Once the mean item duration is known
(measured in this map, or remembered from an earlier map of the same code,
:class:`Remembered`), a batch aims at :data:`TARGET_TASK_SECONDS` of work,
but never more than the remaining work divided by ``spread`` once the end of
the input is known (guided self-scheduling: the tail is balanced), and never
less than :data:`MIN_TASK_SECONDS` of work.  A sized batch's budget is
:data:`BUDGET_FACTOR` times its expected duration, so a stale estimate costs
one short batch, not a long imbalance.
"""

from __future__ import annotations

import math
from typing import Any

#: Work per batch aimed at, in seconds.
TARGET_TASK_SECONDS = 0.2
#: Smallest work per batch once item durations are known (tail batches), in seconds.
MIN_TASK_SECONDS = 0.01
#: Most items in a probe batch (sent before any item duration is known).
PROBE_ITEMS = 256
#: Bytes of items a probe batch may carry (large items make smaller probes).
PROBE_BYTES = 256 * 1024
#: Time budget of a probe batch, in seconds.
PROBE_BUDGET_SECONDS = 0.03
#: A sized batch's budget is this many times its expected duration (at least TARGET_TASK_SECONDS).
BUDGET_FACTOR = 2.0
#: Largest number of items in one batch of an input whose end is not known yet (a generator); it
#: also bounds how far such an input is read ahead (MapJob._take).
MAX_CHUNK_ITEMS = 10_000
#: Largest number of items in one batch once the number of items left is known (a list, a range):
#: 10,000 made a map of 10^6 no-ops 100 round trips of about 1 ms of work each (issue 36: 12x
#: multiprocessing's default chunking); the guided tail still splits what is left over the leases.
MAX_SIZED_CHUNK_ITEMS = 100_000
#: Batches a second one client is asked to send and take back on the direct path: half the
#: ~1,000 RPCs a second measured for one client, the rest of its time left for the results.
CLIENT_BATCHES_PER_SECOND = 500.0


def batch_seconds(leases: int) -> tuple[float, float]:
    """Work per batch aimed at, and the tail's smallest, for a map fed to ``leases`` leases.

    :data:`TARGET_TASK_SECONDS` and :data:`MIN_TASK_SECONDS` while the client
    can feed every lease at that pace; above about 100 leases, batches grow
    so that the client sends at most :data:`CLIENT_BATCHES_PER_SECOND`
    (measured: 256 leases and 16 rollouts of 50 ms each per iteration made
    1,750 batches of about 2 items per iteration, and the client was the limit).
    """
    pace = max(int(leases), 1) / CLIENT_BATCHES_PER_SECOND
    return max(TARGET_TASK_SECONDS, pace), max(MIN_TASK_SECONDS, pace / 4)


def probe_items(item_bytes: int) -> int:
    """Items in a probe batch, for items of about ``item_bytes`` bytes."""
    return int(max(1, min(PROBE_ITEMS, PROBE_BYTES // max(int(item_bytes), 1))))


def next_size(
    *,
    remaining: int | None,
    per_item: float | None,
    spread: int,
    probe: int,
    target: float = TARGET_TASK_SECONDS,
    floor: float = MIN_TASK_SECONDS,
) -> tuple[int, float]:
    """Items and time budget (seconds) of the next auto-sized batch.

    Parameters
    ----------
    remaining : int or None
        Items not yet sent (None while the end of the input is unknown).
    per_item : float or None
        Mean seconds per item (None: unknown, so the batch is a probe).
    spread : int
        Batches the remaining work is spread over in the tail: ``2 × threads``
        on the task path (one running and one queued per thread), and on the
        direct path too (two batch slots per lease, ``remaining`` taken once
        per round of sends), except for a round that starts a map with
        nothing running and one batch per lease holding all that is left
        (an evolution-strategies iteration): the number of leases then, so
        that round gives every lease one equal share.
    probe : int
        Items in a probe batch (:func:`probe_items`).
    target, floor : float
        Work per batch aimed at, and the tail's smallest, in seconds (:func:`batch_seconds`).
    """
    spread = max(int(spread), 1)
    if per_item is None:
        size: float = probe
        if remaining is not None:
            size = min(size, max(math.ceil(remaining / spread), 1))
        budget = PROBE_BUDGET_SECONDS
    else:
        per_item = max(per_item, 1e-7)
        size = target / per_item
        least = math.ceil(floor / per_item)
        if remaining is not None:
            size = min(size, max(math.ceil(remaining / spread), least))
    if remaining is not None:
        size = min(size, remaining)
    n = int(max(1, min(size, MAX_CHUNK_ITEMS if remaining is None else MAX_SIZED_CHUNK_ITEMS)))
    if per_item is not None:  # the budget of the batch actually sent (a long item is one whole item)
        budget = max(BUDGET_FACTOR * per_item * n, target)
    return n, budget


def duration_key(fn: Any) -> tuple | None:
    """What identifies "the same work" across maps: a cell's text, or a function's code."""
    body, targets = getattr(fn, "body", None), getattr(fn, "targets", None)
    if isinstance(body, str) and hasattr(fn, "cell_text"):  # a %%parallel CellFunction
        return ("cell", body, targets)
    target = getattr(fn, "func", fn)  # functools.partial, Pool's task wrapper
    code = getattr(target, "__code__", None)
    if code is not None:
        return ("code", code.co_filename, code.co_firstlineno, code.co_name)
    name = getattr(target, "__qualname__", None)
    module = getattr(target, "__module__", None)
    return ("callable", module, name) if name else None


class Remembered:
    """Mean seconds per item of recently mapped code, the most recent ``limit`` kept."""

    def __init__(self, limit: int = 256):
        self.limit = limit
        self._d: dict[tuple, float] = {}

    def get(self, key: tuple | None) -> float | None:
        return self._d.get(key) if key is not None else None

    def put(self, key: tuple | None, per_item: float) -> None:
        if key is None:
            return
        self._d.pop(key, None)
        self._d[key] = per_item
        while len(self._d) > self.limit:
            self._d.pop(next(iter(self._d)))
