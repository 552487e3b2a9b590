"""A task thread's seat in Dask's thread pool, lent to its helper thread while the helper runs a call.

A call run in a stop group's helper thread (:func:`.groups.run_in_group`: a
``Pool``'s items, every lease batch) may ``secede()`` and ``rejoin()``
(``worker_client()`` does both, around waiting for the tasks it submitted),
and distributed's thread pool acts on the *calling* thread, which must hold a
seat in it.  While the call runs, the helper holds the task thread's seat
(:func:`lend`); afterwards the task thread takes it back (:func:`take_back`),
or, if the call seceded and did not rejoin, stays out of the pool as a
seceded thread does, ending once its task returns.  The pool keeps its size
throughout: the helper is seated before the task thread leaves, and the task
thread before the helper leaves, so a task submitted meanwhile never finds a
seat short and starts an extra thread.
"""

from __future__ import annotations

import threading
from typing import Any


def _tpe() -> Any:
    from distributed import threadpoolexecutor

    return threadpoolexecutor


def lend(helper: threading.Thread) -> Any:
    """In the task thread: give ``helper`` this thread's seat; its executor (None outside Dask's pool)."""
    state = _tpe().thread_state
    executor = getattr(state, "executor", None)
    if executor is None or getattr(state, "proceed", True) is False:
        # Outside Dask's pool, or the task already seceded (a Pool wider than the cluster's threads):
        # there is no seat to lend, and taking one back afterwards would count a thread that ends with
        # its task, leaving the pool a thread short for good (a later map's leases never start).
        return None
    executor._threads.add(helper)
    executor._threads.discard(threading.current_thread())
    return executor


def sit(executor: Any) -> None:
    """In the helper, before the call: the pool's per-thread state, as its own threads have it."""
    if executor is not None:
        state = _tpe().thread_state
        state.executor = executor
        state.proceed = True


def stand(executor: Any) -> bool:
    """In the helper, after the call: forget that state; whether the call seceded (and did not rejoin)."""
    if executor is None:
        return False
    state = _tpe().thread_state
    seceded = getattr(state, "proceed", True) is False
    state.__dict__.pop("proceed", None)
    state.__dict__.pop("executor", None)
    return seceded


def take_back(executor: Any, helper: threading.Thread, seceded: bool) -> None:
    """In the task thread, after the call (or once its group stopped): back in its seat, or out for good."""
    if executor is None:
        return
    if seceded:  # the helper's secede() took the seat out and started a thread in its place
        _tpe().thread_state.proceed = False  # this thread ends after its task, as a seceded one does
        return
    executor._threads.add(threading.current_thread())
    executor._threads.discard(helper)
