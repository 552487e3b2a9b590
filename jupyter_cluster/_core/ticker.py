"""One background thread that runs periodic callbacks for this process.

Progress bars, live widgets and the kernel-side metrics publisher all need a
clock that keeps ticking while the kernel's main thread is busy running a
cell.  Sharing a single daemon thread keeps that to one thread per process.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

_lock = threading.Condition()
_heap: list[tuple[float, int, float, Callable[[], object]]] = []
_counter = itertools.count()
_thread: threading.Thread | None = None


def every(interval: float, callback: Callable[[], object], delay: float | None = None) -> None:
    """Call ``callback()`` every ``interval`` seconds until it returns ``False``.

    The callback runs on the ticker thread; it must be quick and thread-safe.
    An exception stops it (and is logged), so one broken widget cannot stop
    the others.

    Parameters
    ----------
    interval : float
        Seconds between calls.
    callback : callable
        Called with no arguments; return ``False`` to stop being called.
    delay : float, optional
        Seconds before the first call (defaults to ``interval``).
    """
    global _thread
    first = time.monotonic() + (interval if delay is None else delay)
    with _lock:
        heapq.heappush(_heap, (first, next(_counter), interval, callback))
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_run, name="jupyter-cluster-ticker", daemon=True)
            _thread.start()
        _lock.notify()


def _run() -> None:
    while True:
        with _lock:
            while not _heap or _heap[0][0] > time.monotonic():
                timeout = (_heap[0][0] - time.monotonic()) if _heap else None
                _lock.wait(timeout)
            due, _, interval, callback = heapq.heappop(_heap)
        try:
            again = callback() is not False
        except Exception:  # one failing callback must not stop the clock for the others
            logger.exception("jupyter_cluster periodic callback %r failed; it is stopped", callback)
            again = False
        if again:
            with _lock:
                heapq.heappush(_heap, (max(due + interval, time.monotonic()), next(_counter), interval, callback))
