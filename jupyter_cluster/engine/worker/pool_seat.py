"""A task thread's seat in Dask's thread pool, lent to its helper thread while the helper runs a call.

A call run in a stop group's helper thread (:func:`.groups.run_in_group`: a
``Pool``'s items, every lease batch) may ``secede()`` and ``rejoin()``
(``worker_client()`` does both, around waiting for the tasks it submitted),
and distributed's thread pool acts on the *calling* thread, which must hold a
seat in it.  While the call runs, the helper holds the task thread's seat
(:func:`lend`); afterwards the task thread takes it back (:func:`take_back`).
The pool keeps its size throughout: the helper is seated before the task
thread leaves, and the task thread before the helper leaves, so a task
submitted meanwhile never finds a seat short and starts an extra thread.

A call that seceded leaves the pool for good: its ``rejoin()`` returns at
once without taking a seat back, and its task thread stays out too, ending
once its task returns, as a seceded thread does.  Dask counts a task that
seceded as long-running from then on (a later ``rejoin()`` does not tell the
worker), so it starts other work on the thread it believes free.  A
rejoined lease took that seat back and held it for the rest of its life
(batch after batch, then idle for ``engine.linger``): the work Dask started
"on it" waited in the pool's queue, and a nested task an item of the same
map waited for (``worker_client()``) hung the map for ever (a CI timeout of
``tests/engine/test_stalls.py``'s nested map on 1-thread workers).
"""

from __future__ import annotations

import threading
from typing import Any


def _tpe() -> Any:
    from distributed import threadpoolexecutor

    return threadpoolexecutor


class _NoRejoin(list):
    """What ``rejoin()`` queues its thread on: it is let go at once, without a seat (it stays out)."""

    def append(self, entry: Any) -> None:
        _thread, event = entry
        event.set()


class Seat:
    """The pool as a call in the helper thread sees it (the helper's ``thread_state.executor``).

    ``secede()`` acts on the real pool through it (the helper leaves its
    seat, a new pool thread takes it); ``rejoin()`` returns at once and
    leaves the seat to that thread (see the module's text).
    """

    def __init__(self, executor: Any, lent: bool):
        self.executor = executor
        self.lent = lent  # the helper holds the task thread's seat (False: the task had seceded already)
        self._rejoin_lock = threading.Lock()
        self._rejoin_list = _NoRejoin()

    @property
    def _threads(self) -> set:
        return self.executor._threads

    def _adjust_thread_count(self) -> None:
        self.executor._adjust_thread_count()

    def submit(self, fn: Any, *args: Any, **kwargs: Any) -> None:
        """``rejoin()``'s wake-up call for a pool thread: not needed, nobody waits for a seat."""
        return None


def lend(helper: threading.Thread) -> Seat | None:
    """In the task thread: give ``helper`` this thread's seat; None outside Dask's pool."""
    state = _tpe().thread_state
    executor = getattr(state, "executor", None)
    if executor is None:
        return None
    if getattr(state, "proceed", True) is False:
        # The task already seceded (a Pool wider than the cluster's threads, or an earlier call of this
        # lease): there is no seat to lend, and taking one back afterwards would count a thread that
        # ends with its task, leaving the pool a thread short for good.  The helper is out as it is.
        return Seat(executor, lent=False)
    with _tpe().threads_lock:  # as secede() changes the pool's threads: its count of them stays right
        executor._threads.add(helper)
        executor._threads.discard(threading.current_thread())
    return Seat(executor, lent=True)


def out_of_pool() -> bool:
    """In a task thread: whether its task seceded (it ends after its task, as a seceded thread does)."""
    return getattr(_tpe().thread_state, "proceed", True) is False


def sit(seat: Seat | None) -> None:
    """In the helper, before the call: the pool's per-thread state, as its own threads have it."""
    if seat is not None:
        state = _tpe().thread_state
        state.executor = seat
        state.proceed = seat.lent


def stand(seat: Seat | None) -> None:
    """In the helper, after the call: forget that state."""
    if seat is not None:
        state = _tpe().thread_state
        state.__dict__.pop("proceed", None)
        state.__dict__.pop("executor", None)


def take_back(seat: Seat | None, helper: threading.Thread) -> bool:
    """In the task thread, after the call (or once its group stopped): back in its seat, or out for good.

    Returns whether the task is out of the pool (it seceded, now or before).
    """
    if seat is None:
        return False
    if not seat.lent:
        return True
    executor = seat.executor
    with _tpe().threads_lock:  # secede() removes the helper under this lock
        seated = helper in executor._threads
        if seated:
            executor._threads.add(threading.current_thread())
            executor._threads.discard(helper)
    if not seated:  # the call's secede() gave the seat to a new pool thread: this thread ends after its task
        _tpe().thread_state.proceed = False
        return True
    return False
