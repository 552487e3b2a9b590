"""A map that makes no progress while tasks on its workers wait for a thread: :class:`ThreadsWatch` says so.

An item that waits for a task it submitted (``get_client().submit(...).result()``)
without giving its thread up (``worker_client()`` does) holds the thread the
task waits for: on a cluster whose threads the map's leases all hold, the
map waits for ever.  Dask shows the task waiting for a thread (``ready``, or
``constrained`` by resources, in the worker's ``task_counts`` metric); a
task Dask started that waits in the worker's thread pool's queue behind a
lease (Dask's count of free threads was wrong: the hang of the nested maps
fixed in :mod:`.worker.pool_seat`) shows in the engine's own metric
(:data:`.worker.registry.UNSTARTED_METRIC`).  Legitimately long items look
the same for a while, so the watch says nothing before
:data:`NOTICE_SECONDS` without a finished item, then says it once and lets
the map wait (the user interrupts it).  Maps on leases only: on the task
path the map's own queued tasks wait for threads by design.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from .worker.registry import UNSTARTED_METRIC

#: A map with work in flight and no item finished for this long looks at what waits on its workers, in seconds.
NOTICE_SECONDS = 60.0
#: How often a stalled map asks the scheduler about its workers, in seconds.
LOOK_EVERY_SECONDS = 10.0


def waiting_for_threads(workers: dict[str, dict]) -> dict[str, int]:
    """Address -> how many tasks wait for a thread there (``scheduler_identity()["workers"]`` entries)."""
    out = {}
    for addr, info in workers.items():
        metrics = info.get("metrics") or {}
        counts = metrics.get("task_counts") or {}
        n = int(counts.get("ready", 0) or 0) + int(counts.get("constrained", 0) or 0)
        n += int(metrics.get(UNSTARTED_METRIC) or 0)
        if n > 0:
            out[addr] = n
    return out


class ThreadsWatch:
    """Watches one map for the case where it stalls while tasks on its workers wait for a thread.

    Parameters
    ----------
    workers : callable
        ``workers() -> {address: info}``, the scheduler's workers now
        (:func:`.cluster.workers_now`), each with the metrics of its last heartbeat.
    """

    def __init__(self, workers: Callable[[], dict[str, dict]]):
        self._workers = workers
        self._progress = -1
        self._progress_at = time.monotonic()
        self._next_look = 0.0
        self.told = False

    def check(self, progress: int, in_flight: bool, now: float | None = None) -> None:
        """Called every half second or so by the map; ``progress``: items done; prints the notice once."""
        now = time.monotonic() if now is None else now
        if progress != self._progress:
            self._progress, self._progress_at = progress, now
            return
        if self.told or not in_flight or now - self._progress_at < NOTICE_SECONDS or now < self._next_look:
            return
        self._next_look = now + LOOK_EVERY_SECONDS
        try:
            waiting = waiting_for_threads(self._workers())
        except Exception:  # noqa: BLE001 - a scheduler that went away is the connection check's to report
            return
        if not waiting:
            return
        self.told = True
        where = ", ".join(f"{addr} ({n})" for addr, n in sorted(waiting.items())[:8])
        more = f" and {len(waiting) - 8} more workers" if len(waiting) > 8 else ""
        print(
            f"jupyter_cluster: no item of this map finished for {now - self._progress_at:.0f} s while "
            f"{sum(waiting.values())} task(s) wait for a thread on {where}{more}.  If the items wait for tasks "
            "they submitted, they hold the threads those tasks need: submit them inside "
            "`with distributed.worker_client() as client:` (it gives the item's thread up while it waits), "
            "or interrupt to stop.",
            file=sys.stderr,
            flush=True,
        )
