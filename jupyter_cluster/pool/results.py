"""The result objects of :class:`~jupyter_cluster.pool.Pool`: ``ApplyResult``, ``MapResult`` and the
imap iterators, with multiprocessing's contract (``get(timeout)``, ``wait``, ``ready``, ``successful``)."""

from __future__ import annotations

import queue
import sys
import threading
import traceback
import types
from collections.abc import Callable, Iterable, Iterator
from multiprocessing import TimeoutError
from typing import Any, Protocol, TypeVar

from .worker import _with_remote_traceback


class _PoolLike(Protocol):
    """What a result needs of its :class:`~jupyter_cluster.pool.Pool` (results sit below the pool)."""

    _state: str

    def _cache_add(self, result: ApplyResult) -> None: ...

    def _cache_remove(self, result: ApplyResult) -> None: ...


# multiprocessing.pool's own state values, so code that reads or sets Pool._state sees the same.
INIT, RUN, CLOSE, TERMINATE = "INIT", "RUN", "CLOSE", "TERMINATE"

# -- result objects -------------------------------------------------------------------


class ApplyResult:
    """The result of :meth:`Pool.apply_async` (``multiprocessing.pool.AsyncResult``)."""

    def __class_getitem__(cls, item: Any) -> types.GenericAlias:  # ApplyResult[int], as multiprocessing allows
        return types.GenericAlias(cls, item)

    def __init__(self, pool: _PoolLike, callback: Callable | None, error_callback: Callable | None):
        self._pool = pool
        self._event = threading.Event()
        self._callback = callback
        self._error_callback = error_callback
        self._success: bool | None = None
        self._value: Any = None
        pool._cache_add(self)

    def ready(self) -> bool:
        """Whether the call has completed."""
        return self._event.is_set()

    def successful(self) -> bool:
        """Whether the call completed without raising; ``ValueError`` if not ready."""
        if not self.ready():
            raise ValueError(f"{self!r} not ready")
        return bool(self._success)

    def wait(self, timeout: float | None = None) -> None:
        """Wait until the result is available or ``timeout`` seconds pass."""
        self._event.wait(timeout)

    def get(self, timeout: float | None = None) -> Any:
        """The result; re-raises the task's exception (same type).

        Raises ``multiprocessing.TimeoutError`` if not ready after ``timeout`` seconds.
        """
        self.wait(timeout)
        if not self.ready():
            raise TimeoutError
        if self._success:
            return self._value
        raise self._value

    def _set(self, success: bool, value: Any) -> None:
        self._success, self._value = success, value
        callback = self._callback if success else self._error_callback
        if callback is not None:
            try:
                callback(value)
            except Exception:  # a failing callback must not stop the pool's result thread
                print(f"Exception in {'callback' if success else 'error_callback'} of {self!r}:", file=sys.stderr)
                traceback.print_exc()
        self._event.set()
        self._pool._cache_remove(self)


AsyncResult = ApplyResult


class MapResult(ApplyResult):
    """The result of :meth:`Pool.map_async` / :meth:`Pool.starmap_async`; ``get()`` returns a list."""


class IMapIterator:
    """The iterator returned by :meth:`Pool.imap`; ``next(timeout)`` as in multiprocessing.

    The input is consumed lazily: only a bounded number of items is in
    flight, however long (or infinite) the iterable.
    """

    _ordered = True

    def __init__(self, pool: _PoolLike, job: Any, input_failed: list | None = None):
        self._pool = pool
        self._job = job
        # The exception the input raised (see _guarded): comes after the items read before it.
        self._input_failed = input_failed if input_failed is not None else []
        self._lock = threading.Lock()
        self._buffer: queue.Queue | None = None  # set once a timed next() starts the feeder
        self._stop = threading.Event()
        self._done = False

    def __iter__(self) -> IMapIterator:
        return self

    def _check(self) -> None:
        if self._pool._state == TERMINATE:
            raise ValueError("Pool not running")

    def next(self, timeout: float | None = None) -> Any:
        """The next result; ``multiprocessing.TimeoutError`` after ``timeout`` seconds.

        A failed item raises its exception at its place in the sequence;
        iterating further goes on with the next items, as in multiprocessing.
        """
        self._check()
        if self._done:
            raise StopIteration
        if timeout is None and self._buffer is None:
            # The common `for x in pool.imap(...)` path: pull straight from the engine.
            try:
                value = next(self._job)
            except StopIteration:
                self._done = True
                self._raise_input_failure()
                raise
            except BaseException:
                self._done = True
                self._check()
                raise
            if _is_failure(self._job, value):
                raise _remote_failure(self._job, value)
            return value
        buffer = self._start_feeder()
        try:
            kind, value = buffer.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError from None
        if kind == "value":
            return value
        if kind == "error":
            raise _remote_failure(self._job, value)
        self._done = True
        if kind == "fail":
            self._check()
            raise value
        self._raise_input_failure()
        raise StopIteration

    def _raise_input_failure(self) -> None:
        if self._input_failed:
            raise self._input_failed.pop()

    __next__ = next

    def _start_feeder(self) -> queue.Queue:
        """The one-slot buffer a feeder thread fills (started by the first timed ``next``)."""
        with self._lock:
            if self._buffer is not None:
                return self._buffer
            buffer = self._buffer = queue.Queue(maxsize=1)
        threading.Thread(
            target=_feed, args=(self._job, buffer, self._stop), daemon=True, name="jupyter-cluster-imap"
        ).start()
        return buffer

    def __del__(self) -> None:
        # An abandoned iterator must not leave its map running on the cluster.
        if not self._done:
            self._cancel()

    def _cancel(self) -> None:
        self._stop.set()
        try:
            self._job.cancel()
        except Exception:  # the cluster may already be gone; nothing left to cancel
            pass


def _feed(job: Any, buffer: queue.Queue, stop: threading.Event) -> None:
    """Move results from a map job into a one-slot buffer, so a consumer can wait with a timeout.

    The slot keeps the engine's backpressure: while the consumer does not take
    a result, this thread does not ask the engine for the next one.
    """

    def put(entry: tuple) -> bool:
        while not stop.is_set():
            try:
                buffer.put(entry, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    try:
        for value in job:
            if not put(("error" if _is_failure(job, value) else "value", value)):
                return
    except BaseException as exc:
        put(("fail", exc))
        return
    put(("done", None))


def _is_failure(job: Any, value: Any) -> bool:
    """Whether ``value`` stands for a failed item (the engine runs imap with errors="collect")."""
    return isinstance(value, BaseException) and any(value is e for e in job.errors.values())


def _remote_failure(job: Any, exc: BaseException) -> BaseException:
    """A failed item's exception with its remote traceback as ``__cause__``, as multiprocessing raises it."""
    for index, failed in job.errors.items():
        if failed is exc:
            entry = getattr(job, "tracebacks", {}).get(index)
            return _with_remote_traceback(exc, entry[0] if entry else None)
    return exc


def _raise_first_failure(job: Any) -> None:
    """Raise the first failed item's exception of a finished map, if any (``map`` and ``map_async``).

    As in multiprocessing, the map ends first: every item has run (none is
    left running on the cluster behind the caller's back, so ``join()``
    after a failed map waits for nothing).
    """
    if job.errors:
        raise _remote_failure(job, job.errors[min(job.errors)])


#: Inputs whose reading cannot raise: imap passes them to the engine as they are (which keeps their length).
_PLAIN_INPUTS = (list, tuple, range, dict, set, frozenset, str, bytes)


def _guarded(iterable: Iterable, chunksize: int, failed: list) -> Iterator:
    """``iterable`` read as multiprocessing's imap reads it: an exception ends the input, into ``failed``.

    The iterator then raises it after the results of the items read before
    it, leaving out the chunk being read when it came (as multiprocessing
    does), instead of the engine raising it from whichever ``next()`` is
    reading ahead at the time.
    """
    it = iter(iterable)  # a non-iterable is a TypeError here, in the caller

    def read() -> Iterator:
        while True:
            group = []
            try:
                for _ in range(chunksize):
                    group.append(next(it))
            except StopIteration:
                yield from group
                return
            except Exception as exc:
                failed.append(exc)
                return
            yield from group

    return read()


class IMapUnorderedIterator(IMapIterator):
    """The iterator returned by :meth:`Pool.imap_unordered` (results in completion order)."""

    _ordered = False


_Iter = TypeVar("_Iter", bound=IMapIterator)
