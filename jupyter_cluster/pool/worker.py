"""What a pool runs on the workers: the task (initializer once per process, then the function),
its failure sent back as data, and the check that a result can be sent back."""

from __future__ import annotations

import builtins
import io
import pickle
import sys
import threading
import types
from collections.abc import Callable, Iterable
from multiprocessing.pool import MaybeEncodingError, RemoteTraceback  # type: ignore[attr-defined]  # not in typeshed
from typing import Any

import cloudpickle

from ..engine.worker import GroupStopped, error_info, run_in_group

# -- what runs on the workers ------------------------------------------------------

# Pools whose initializer already ran in this (worker) process.  Keyed by pool
# id, so a worker shared by several pools runs each pool's initializer once.
_initialized: set[str] = set()
_init_lock = threading.Lock()
# Globals shared by a pool's notebook-defined functions in this process, and
# the names its initializer set there (see _adopt).
_namespaces: dict[str, dict] = {}
_init_names: dict[str, frozenset] = {}


def _by_value(func: Any) -> bool:
    """Whether ``func`` was pickled by value (defined in a notebook or ``__main__``)."""
    if not isinstance(func, types.FunctionType):
        return False
    module = sys.modules.get(func.__module__ or "")
    return module is None or module.__dict__ is not func.__globals__


def _rebind(func: types.FunctionType, namespace: dict) -> types.FunctionType:
    new = types.FunctionType(func.__code__, namespace, func.__name__, func.__defaults__, func.__closure__)
    new.__kwdefaults__ = func.__kwdefaults__
    new.__qualname__ = func.__qualname__
    new.__module__ = func.__module__
    new.__dict__.update(func.__dict__)
    return new


def _adopt(func: Any, pool_id: str, protected: Iterable[str]) -> Any:
    """``func`` rebound to its pool's per-process globals.

    cloudpickle gives every unpickled notebook function a private globals
    dict, so ``global model`` set by an initializer would be invisible to the
    tasks.  Under ``fork`` they share ``__main__``; here they share one dict per
    pool per worker process.  The values captured with each task win (they
    are the notebook's current ones), except names the initializer set.
    """
    if not _by_value(func):
        return func
    namespace = _namespaces.setdefault(pool_id, {"__builtins__": builtins})
    source = func.__globals__
    protected = set(protected)
    for name, value in source.items():
        if name in protected or name == "__builtins__":
            continue
        if isinstance(value, types.FunctionType) and value.__globals__ is source:
            value = _rebind(value, namespace)  # helpers defined next to func see the same globals
        namespace[name] = value
    return _rebind(func, namespace)


def _run_initializer(pool_id: str, initializer: Callable, initargs: tuple) -> None:
    with _init_lock:  # tasks on other threads of this worker wait for it, as in multiprocessing
        if pool_id in _initialized:
            return
        init = _adopt(initializer, pool_id, ())
        namespace = _namespaces.get(pool_id, {})
        before = dict(namespace)
        try:
            init(*initargs)
        except BaseException as exc:
            if hasattr(exc, "add_note"):  # Python 3.11+; on 3.10 the exception goes up without the note
                exc.add_note(
                    f"(raised by the initializer of {pool_id}; the next task in this worker process tries it again)"
                )
            raise
        _init_names[pool_id] = frozenset(k for k, v in namespace.items() if k not in before or before[k] is not v)
        _initialized.add(pool_id)


def _forget_pool(pool_id: str) -> None:
    """Run on every worker when a pool with an initializer ends."""
    with _init_lock:
        _initialized.discard(pool_id)
        _namespaces.pop(pool_id, None)
        _init_names.pop(pool_id, None)


class _PoolTask:
    """The callable a pool ships: the pool's initializer once per process, then ``func``.

    The user's function is kept in ``func`` so that Dask names tasks after it
    (``dask.utils.funcname`` follows ``.func``).
    """

    __slots__ = ("func", "pool_id", "initializer", "initargs", "star", "_bound")

    def __init__(self, func: Callable, pool_id: str, initializer: Callable | None, initargs: tuple, star: bool):
        self.func = func
        self.pool_id = pool_id
        self.initializer = initializer
        self.initargs = initargs
        self.star = star
        self._bound: Callable | None = None

    def __reduce__(self):
        return (_PoolTask, (self.func, self.pool_id, self.initializer, self.initargs, self.star))

    @property
    def __name__(self) -> str:
        return getattr(self.func, "__name__", type(self.func).__name__)

    def check_result(self, value: Any) -> BaseException | None:
        """multiprocessing's error for a map item's result that cannot be sent back, or None (run_chunk asks)."""
        problem = _unsendable(value)
        return None if problem is None else MaybeEncodingError(problem, value)

    def direct_call(self) -> tuple[Callable, bool] | None:
        """``(function, star)`` to call on each item in this task's place, or None (not yet: the initializer).

        What :meth:`__call__` calls, without its own Python call per item: a
        chunk of quick items run in slices (:mod:`..engine.worker.slices`)
        calls it directly (a map of 10^6 trivial items spent 70 % of its
        workers' CPU in this wrapper, issue 36).  Once the pool's initializer
        has run in this process, the function bound to what it defined.
        """
        if self.initializer is None:
            return self.func, self.star
        if self.pool_id not in _initialized or self._bound is None:
            return None  # the per-item calls run the initializer and bind the function first
        return self._bound, self.star

    @property
    def stop_group(self) -> str:
        """The pool's id: ``terminate()`` stops the pool's running items on the workers by it."""
        return self.pool_id

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        func = self.func
        if self.initializer is not None:
            if self.pool_id not in _initialized:
                _run_initializer(self.pool_id, self.initializer, self.initargs)
            bound = self._bound
            if bound is None:
                bound = self._bound = _adopt(func, self.pool_id, _init_names.get(self.pool_id, ()))
            func = bound
        if self.star:
            (args,) = args
        return func(*args, **kwargs)


def _apply(task: _PoolTask, args: tuple, kwds: dict, secede: bool = False) -> Any:
    """The task of ``apply_async``: ``task(*args, **kwds)``, stopped by the pool's ``terminate()``.

    args and kwds travel as two plain values, so a user's keyword such as
    ``key`` or ``workers`` never reaches Client.submit.  With ``secede`` (a
    pool asked for more processes than the cluster has threads) the task
    leaves Dask's thread count first, so the pool's N calls run at once even
    when they wait on each other, as N processes would.
    """
    if secede:
        from distributed import secede as leave_thread_pool

        leave_thread_pool()
    try:
        return run_in_group(task.pool_id, _call, task, args, kwds)
    except GroupStopped:  # terminated: nobody reads this result
        return None


def _apply_chunk(task: _PoolTask, blob: bytes, secede: bool) -> Any:
    """The task of one chunk (pickled items) of a map of a pool wider than the cluster: each item's value or :class:`_Failed`."""
    return _apply(task, (cloudpickle.loads(blob),), {"\0chunk": True}, secede)


def _call(task: _PoolTask, args: tuple, kwds: dict) -> Any:
    if kwds.get("\0chunk"):  # a chunk of a wide pool's map (see _apply_chunk): every item runs
        (items,) = args
        return [_call(task, (item,), {}) for item in items]
    try:
        value = task(*args, **kwds)
    except BaseException as exc:  # noqa: BLE001 - sent back as data, as multiprocessing does
        return _Failed.of(exc)
    problem = task.check_result(value)
    if problem is not None:  # multiprocessing's error for a result it cannot send back (the worker lives on)
        return _Failed(problem, None)
    return value


class _Failed:
    """A call's exception, sent back as its result with the remote traceback's text.

    As a value rather than a raised error, it reaches the pool with the text
    ``multiprocessing`` puts in ``exc.__cause__`` (a ``RemoteTraceback``),
    and Dask does not log the call as failed: the error reaches the user once.
    """

    __slots__ = ("exc", "text")

    def __init__(self, exc: BaseException, text: str | None):
        self.exc = exc
        self.text = text

    def __reduce__(self):
        return (_Failed, (self.exc, self.text))

    @classmethod
    def of(cls, exc: BaseException) -> _Failed:
        from ..engine.protocol import RemoteItemError

        sendable, type_name, message, text, _ = error_info(exc)
        if sendable is None:  # the exception itself cannot be pickled: its type and message come back
            sendable = RemoteItemError(f"{type_name}: {message}")
        return cls(sendable, text)

    def error(self) -> BaseException:
        return _with_remote_traceback(self.exc, self.text)


def _with_remote_traceback(exc: BaseException, text: str | None) -> BaseException:
    """``exc`` with ``__cause__`` a ``multiprocessing.pool.RemoteTraceback`` of ``text``, as multiprocessing has it."""
    if text and exc.__cause__ is None:
        exc.__cause__ = RemoteTraceback(f'\n"""\n{text}"""')
    return exc


def _skip_buffer(buffer: Any) -> None:
    """Out-of-band buffers (arrays) are not copied by the sendability check."""
    return None


#: Result types that can always be sent back.
_SCALARS = frozenset({type(None), bool, int, float, complex, str, bytes})


class _NotebookPickler(cloudpickle.Pickler):
    """pickle's rules, plus code defined in the notebook or ``__main__`` (pickled by value).

    What ``multiprocessing`` cannot send back (a lambda or local function of
    an importable module) is refused here too, while the instances of
    notebook-defined classes a task returns still travel.
    """

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (types.FunctionType, type)) and not _defined_by_value(obj) and not _importable(obj):
            raise pickle.PicklingError(f"Can't pickle {obj!r}: it is not found as {obj.__module__}.{obj.__qualname__}")
        return super().reducer_override(obj)


def _defined_by_value(obj: Any) -> bool:
    module = sys.modules.get(obj.__module__ or "")
    return module is None or obj.__module__ == "__main__" or getattr(module, "__file__", None) is None


def _importable(obj: Any) -> bool:
    found: Any = sys.modules.get(obj.__module__ or "")
    for part in obj.__qualname__.split("."):
        found = getattr(found, part, None)
    return found is obj


def _unsendable(value: Any) -> Exception | None:
    """Why ``value`` cannot be sent back to the pool (None when it can)."""
    if type(value) in _SCALARS:
        return None
    try:
        pickle.dumps(value, protocol=5, buffer_callback=_skip_buffer)
        return None
    except Exception:
        pass
    try:
        _NotebookPickler(io.BytesIO(), protocol=5, buffer_callback=_skip_buffer).dump(value)
        return None
    except Exception as exc:
        return exc
