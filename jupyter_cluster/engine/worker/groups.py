"""Stop groups: a ``Pool``'s work on a worker, stopped at once by ``Pool.terminate()``.

A ``Pool``'s items run in a helper thread of their task's thread
(:func:`run_in_group`), so that :func:`stop_group` gives the task's thread
back to Dask at once, even from a blocking C call.
"""

from __future__ import annotations

import contextvars
import queue
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from . import pool_seat

#: Per task thread: its helper thread (``group_runner``), and whether its last chunk was stopped.
_local = threading.local()


def _async_raise(thread: threading.Thread, exc_type) -> None:
    import ctypes

    if thread.ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(exc_type))


class GroupStopped(BaseException):
    """Raised in work of a stop group that was stopped (``Pool.terminate()``).

    A ``BaseException``, as ``KeyboardInterrupt`` is, so that a task's own
    ``except Exception`` does not swallow it.
    """


class _Group:
    """One stop group on this worker: whether it was stopped, and the calls of it that run now."""

    __slots__ = ("stopped", "running")

    def __init__(self):
        self.stopped = threading.Event()
        # helper thread -> the event its waiting task thread sleeps on
        self.running: dict[threading.Thread, threading.Event] = {}


#: Stop groups seen by this worker process, newest last.  Bounded: a group is only needed while its
#: pool's work can still arrive, and every ``with Pool():`` block stops one.
_GROUPS: OrderedDict[str, _Group] = OrderedDict()
_GROUPS_LOCK = threading.Lock()
MAX_GROUPS = 10_000


def _group(name: str) -> _Group:
    with _GROUPS_LOCK:
        group = _GROUPS.get(name)
        if group is None:
            group = _GROUPS[name] = _Group()
            while len(_GROUPS) > MAX_GROUPS:
                _GROUPS.popitem(last=False)
        return group


def stop_group(name: str) -> int:
    """Stop the work of group ``name`` on this worker now; returns how many calls were running.

    Run on the worker's event loop (``run_on_every_worker``) by
    ``Pool.terminate()``.  Work of the group that arrives later stops at once.
    Each running call's task thread is woken and returns, so Dask has that
    thread back at once, as ``multiprocessing`` has its processes back when it
    ends them; the helper thread that ran the call gets :class:`GroupStopped`
    raised in it (Python code stops at once, a blocking C call such as
    ``time.sleep`` when it returns) and then ends.
    """
    group = _group(name)
    group.stopped.set()
    with _GROUPS_LOCK:
        running = list(group.running.items())
    for thread, woken in running:
        _async_raise(thread, GroupStopped)
        woken.set()
    return len(running)


class _GroupRunner:
    """This task thread's helper thread, which runs calls of stop groups so that they can be abandoned.

    One per task thread, reused from call to call (a handoff costs about
    what an ``Event`` round trip costs, once per chunk or apply); replaced
    when a stopped group abandons it.
    """

    def __init__(self):
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, daemon=True, name="jupyter-cluster-pool-item")
        self.thread.start()

    def _loop(self) -> None:
        from distributed.worker import thread_state

        while True:
            job = self.jobs.get()
            if job is None:
                return
            call, args, state, ctx, seat, done, box = job
            # get_worker(), get_client() and the task's key work in the call as in its task thread
            # (distributed keeps the worker in a context variable: the task thread's context runs the
            # call), and so do secede() and rejoin() (worker_client()): the helper holds its seat.
            thread_state.__dict__.update(state)
            pool_seat.sit(seat)
            try:
                box.append((True, ctx.run(call, *args)))
            except BaseException as exc:  # noqa: BLE001 - handed to the task thread
                box.append((False, exc))
            finally:
                thread_state.__dict__.clear()
                pool_seat.stand(seat)
                done.set()


def run_in_group(name: str, call: Callable, *args: Any) -> Any:
    """``call(*args)`` as work of stop group ``name``: raises :class:`GroupStopped` once the group is stopped.

    The call runs in this task thread's helper thread while the task thread
    waits, so that :func:`stop_group` can give the task thread back to Dask
    at once, even when the call is blocked in C code.
    """
    from distributed.worker import thread_state

    group = _group(name)
    if group.stopped.is_set():
        raise GroupStopped(f"stop group {name} was stopped")
    local = _local
    runner = getattr(local, "group_runner", None)
    if runner is None:
        runner = local.group_runner = _GroupRunner()
    done: threading.Event = threading.Event()
    box: list = []
    with _GROUPS_LOCK:
        group.running[runner.thread] = done
    seat = None
    try:
        if group.stopped.is_set():  # stopped between the check above and the registration
            raise GroupStopped(f"stop group {name} was stopped")
        seat = pool_seat.lend(runner.thread)
        ctx = contextvars.copy_context()
        runner.jobs.put((call, args, dict(thread_state.__dict__), ctx, seat, done, box))
        done.wait()
    finally:
        with _GROUPS_LOCK:
            group.running.pop(runner.thread, None)
        pool_seat.take_back(seat, runner.thread)
    if group.stopped.is_set():
        # Woken by stop_group, or stopped as the call ended: GroupStopped may still land in the helper
        # (raised asynchronously), so it is not used again; it ends after its call, and a new one is made.
        runner.jobs.put(None)
        local.group_runner = None
        if not box:
            raise GroupStopped(f"stop group {name} was stopped")
    ok, value = box[0]
    if ok:
        return value
    raise value


def mark_stopped() -> None:
    """The chunk this thread runs was stopped by its group (its lease ends: see :func:`took_stop`)."""
    _local.group_stopped = True


def took_stop() -> bool:
    """Whether the chunk this thread just ran was stopped by its group (and forget it)."""
    local = _local
    if getattr(local, "group_stopped", False):
        local.group_stopped = False
        return True
    return False
