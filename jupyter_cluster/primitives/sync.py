"""``Lock``, ``RLock``, ``Semaphore``, ``BoundedSemaphore``, ``Condition``, ``Event``, ``Barrier`` across the cluster.

Each is kept by the scheduler (:mod:`.shared_store`) and behaves as its
:mod:`multiprocessing` namesake for every process that holds a copy: the
notebook, tasks, ``Process`` targets, standard ``multiprocessing`` children.
A call interrupted while it waits may still complete on the scheduler (a
lock then stays taken): do not interrupt a waiting ``acquire``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from .shared import Shared, owner_token


def _timeout(block: bool, timeout: float | None) -> float | None:
    if not block:
        return 0.0
    if timeout is None:
        return None
    return max(float(timeout), 0.0)


class _SemLock(Shared):
    _kind = "sem"
    _prefix = "lock"

    def __init__(self, value: int = 1, bound: int | None = None, *, client: Any = None, ctx: Any = None):
        if value < 0:
            raise ValueError("semaphore initial value must be >= 0")
        self._bind(client)
        self._call("sem_create", name=self._name, kind=self._kind, value=value, bound=bound)

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        """Take it; ``False`` when ``block`` is false or ``timeout`` passed first."""
        status = self._call("sem_acquire", name=self._name, owner=owner_token(), timeout=_timeout(block, timeout))
        if status == "missing":
            raise self._missing()
        return status == "ok"

    def release(self) -> None:
        """Give it back."""
        status = self._call("sem_release", name=self._name, owner=owner_token())
        if status == "too-many":
            raise ValueError("semaphore or lock released too many times")
        if status == "not-owner":
            raise AssertionError("attempt to release recursive lock not owned by thread")
        if status == "missing":
            raise self._missing()

    def _state(self) -> dict[str, Any]:
        state = self._call("sem_state", name=self._name)
        if state is None:
            raise self._missing()
        return state

    def get_value(self) -> int:
        """The counter's value now (multiprocessing has it only on some systems)."""
        return int(self._state()["value"])

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


class Lock(_SemLock):
    """A non-recursive lock shared by every process of the cluster (``multiprocessing.Lock``)."""

    _kind = "lock"

    def __init__(self, *, client: Any = None, ctx: Any = None):
        super().__init__(1, 1, client=client)

    def _is_owned(self) -> bool:
        state = self._state()
        return state["value"] == 0 and state["owner"] == owner_token()


class RLock(_SemLock):
    """A re-entrant lock: the thread that holds it may take it again (``multiprocessing.RLock``)."""

    _kind = "rlock"

    def __init__(self, *, client: Any = None, ctx: Any = None):
        super().__init__(1, 1, client=client)

    def _is_owned(self) -> bool:
        state = self._state()
        return state["count"] > 0 and state["owner"] == owner_token()

    def _count(self) -> int:
        state = self._state()
        return int(state["count"]) if state["owner"] == owner_token() else 0


class Semaphore(_SemLock):
    """A counting semaphore (``multiprocessing.Semaphore``)."""

    def __init__(self, value: int = 1, *, client: Any = None, ctx: Any = None):
        super().__init__(value, None, client=client)


class BoundedSemaphore(_SemLock):
    """A semaphore that may not be released above its initial value."""

    def __init__(self, value: int = 1, *, client: Any = None, ctx: Any = None):
        super().__init__(value, value, client=client)


class Condition(Shared):
    """A condition variable (``multiprocessing.Condition``); its lock defaults to a new :class:`RLock`."""

    _prefix = "condition"

    def __init__(self, lock: _SemLock | None = None, *, client: Any = None, ctx: Any = None):
        self._lock = lock if lock is not None else RLock(client=client)
        self._bind(client if client is not None else self._lock._live_client)

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        return self._lock.acquire(block, timeout)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *exc: Any) -> None:
        self._lock.release()

    def wait(self, timeout: float | None = None) -> bool:
        """Release the lock, wait for a notify (or ``timeout``), take the lock again; ``False`` on timeout."""
        status = self._call(
            "cond_wait",
            name=self._name,
            lock=self._lock._name,
            owner=owner_token(),
            timeout=None if timeout is None else max(float(timeout), 0.0),
        )
        if status == "not-owner":
            raise RuntimeError("cannot wait on un-acquired lock")
        if status == "missing":
            raise self._missing()
        return status == "ok"

    def wait_for(self, predicate: Callable[[], Any], timeout: float | None = None) -> Any:
        """Wait until ``predicate()`` is true (or ``timeout``); returns its last value."""
        result = predicate()
        if result:
            return result
        deadline = None if timeout is None else time.monotonic() + timeout
        while not result:
            waittime = None
            if deadline is not None:
                waittime = deadline - time.monotonic()
                if waittime <= 0:
                    break
            self.wait(waittime)
            result = predicate()
        return result

    def notify(self, n: int = 1) -> None:
        """Wake up to ``n`` waiting processes (the caller must hold the lock)."""
        self._check_owned()
        self._call("cond_notify", name=self._name, n=n)

    def notify_all(self) -> None:
        """Wake every waiting process."""
        self._check_owned()
        self._call("cond_notify", name=self._name, n=None)

    def _check_owned(self) -> None:
        owned = getattr(self._lock, "_is_owned", None)
        if owned is not None and not owned():
            raise AssertionError("lock is not owned")


class Event(Shared):
    """An event flag shared by every process (``multiprocessing.Event``)."""

    _prefix = "event"

    def __init__(self, *, client: Any = None, ctx: Any = None):
        self._bind(client)
        self._call("event_op", name=self._name, what="clear")

    def is_set(self) -> bool:
        return bool(self._call("event_op", name=self._name, what="get"))

    def set(self) -> None:
        self._call("event_op", name=self._name, what="set")

    def clear(self) -> None:
        self._call("event_op", name=self._name, what="clear")

    def __repr__(self) -> str:
        return f"<Event at {id(self):#x} {'set' if self.is_set() else 'unset'}>"

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until set (or ``timeout``); returns whether it is set."""
        wait = None if timeout is None else max(float(timeout), 0.0)
        return bool(self._call("event_wait", name=self._name, timeout=wait))


class Barrier(Shared):
    """A barrier for ``parties`` processes (``multiprocessing.Barrier``).

    ``action`` runs in the last process to arrive, before the others are released.
    """

    _prefix = "barrier"

    def __init__(
        self,
        parties: int,
        action: Callable | None = None,
        timeout: float | None = None,
        *,
        client: Any = None,
        ctx: Any = None,
    ):
        if parties < 1:
            raise ValueError("parties must be > 0")
        self._parties = parties
        self._action = action
        self._timeout = timeout
        self._bind(client)
        self._call("barrier_create", name=self._name, parties=parties, action=action is not None)

    def wait(self, timeout: float | None = None) -> int:
        """Wait until ``parties`` processes wait; returns this one's arrival index (``0`` .. ``parties - 1``)."""
        if timeout is None:
            timeout = self._timeout
        reply = self._call("barrier_wait", name=self._name, timeout=timeout)
        if reply["status"] == "missing":
            raise self._missing()
        if reply["status"] != "ok":
            raise threading.BrokenBarrierError
        if reply.get("action"):
            try:
                self._action()  # type: ignore[misc]
            except BaseException:
                self._call("barrier_release", name=self._name, ok=False)
                raise
            self._call("barrier_release", name=self._name, ok=True)
        return int(reply["index"])

    def _op(self, op: str) -> dict[str, Any]:
        reply = self._call("barrier_op", name=self._name, what=op)
        if reply["status"] == "missing":
            raise self._missing()
        return reply

    def reset(self) -> None:
        """Back to the empty state; processes waiting now get ``BrokenBarrierError``."""
        self._op("reset")

    def abort(self) -> None:
        """Break the barrier: waiting and later ``wait()`` calls raise ``BrokenBarrierError``."""
        self._op("abort")

    @property
    def parties(self) -> int:
        return self._parties

    @property
    def n_waiting(self) -> int:
        return int(self._op("state")["n_waiting"])

    @property
    def broken(self) -> bool:
        return bool(self._op("state")["broken"])
