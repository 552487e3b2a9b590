"""``import jupyter_cluster.multiprocessing as mp``: the standard library's API on the cluster.

Each name behaves as its :mod:`multiprocessing` namesake, on the current
cluster (the default local one is started if there is none): a
:class:`Process`'s target runs on a worker; ``Queue``, ``SimpleQueue``,
``JoinableQueue`` and ``Pipe`` are channels kept by the scheduler; ``Lock``,
``RLock``, ``Semaphore``, ``BoundedSemaphore``, ``Condition``, ``Event``
and ``Barrier`` are kept by the scheduler too, so that every process holding
one sees the same object; ``Manager()`` serves dicts, lists, namespaces and
values from the scheduler, and ``Value``/``Array`` are such values (there is
no shared memory between the machines of a cluster).  Every object works from
the notebook, a ``Pool`` task, a ``Process``, an actor, a ``%%parallel``
item and a standard ``multiprocessing`` child of the notebook.  The
differences from :mod:`multiprocessing` are listed in docs/pool.md.

Examples
--------
>>> import jupyter_cluster.multiprocessing as mp
>>> def work(q):
...     q.put("hello")
>>> q = mp.Queue()                                      # doctest: +SKIP
>>> p = mp.Process(target=work, args=(q,)); p.start()   # doctest: +SKIP
>>> q.get(timeout=30)                                   # doctest: +SKIP
'hello'
"""

from __future__ import annotations

import multiprocessing as _std
from multiprocessing import (
    AuthenticationError,
    BufferTooShort,
    ProcessError,
    TimeoutError,
)
from typing import Any

# A script's local cluster gets its fork server by forking the script once distributed is imported
# (backends/local/fork_self.py), not from an interpreter begun at this import: that one imported
# distributed a second time, beside this process's own import, on the first result's path.
from .pool import Pool
from .primitives.channels import JoinableQueue, Pipe, Queue, SimpleQueue
from .primitives.manager import ArrayProxy, SyncManager, ValueProxy
from .primitives.process import Process, active_children, current_process
from .primitives.sync import Barrier, BoundedSemaphore, Condition, Event, Lock, RLock, Semaphore

__all__ = [
    "Array",
    "AuthenticationError",
    "Barrier",
    "BoundedSemaphore",
    "BufferTooShort",
    "Condition",
    "Event",
    "JoinableQueue",
    "Lock",
    "Manager",
    "Pipe",
    "Pool",
    "Process",
    "ProcessError",
    "Queue",
    "RLock",
    "RawArray",
    "RawValue",
    "Semaphore",
    "SimpleQueue",
    "TimeoutError",
    "Value",
    "active_children",
    "allow_connection_pickling",
    "cpu_count",
    "current_process",
    "freeze_support",
    "get_all_start_methods",
    "get_context",
    "get_logger",
    "get_start_method",
    "log_to_stderr",
    "parent_process",
    "set_executable",
    "set_forkserver_preload",
    "set_start_method",
]

_start_method: str | None = None


class _Manager(SyncManager):
    def Pool(self, *args: Any, **kwargs: Any) -> Pool:  # noqa: N802 (multiprocessing's name)
        return Pool(*args, **kwargs)


def Manager() -> SyncManager:  # noqa: N802 (multiprocessing's name)
    """A manager whose shared objects are served from the cluster (``multiprocessing.Manager()``)."""
    return _Manager()


def Value(typecode_or_type: Any, *args: Any, lock: Any = True) -> ValueProxy:  # noqa: N802
    """A value every process shares, kept by the scheduler (no shared memory: see docs/pool.md)."""
    return ValueProxy(_typecode(typecode_or_type), args[0] if args else None, lock)


def RawValue(typecode_or_type: Any, *args: Any) -> ValueProxy:  # noqa: N802
    """A :func:`Value` without a lock."""
    return ValueProxy(_typecode(typecode_or_type), args[0] if args else None, False)


def Array(typecode_or_type: Any, size_or_initializer: Any, *, lock: Any = True) -> ArrayProxy:  # noqa: N802
    """An array every process shares, kept by the scheduler (no shared memory: see docs/pool.md)."""
    return ArrayProxy(_typecode(typecode_or_type), size_or_initializer, lock)


def RawArray(typecode_or_type: Any, size_or_initializer: Any) -> ArrayProxy:  # noqa: N802
    """An :func:`Array` without a lock."""
    return ArrayProxy(_typecode(typecode_or_type), size_or_initializer, False)


def _typecode(typecode_or_type: Any) -> Any:
    """A ctypes type's one-letter code (``ctypes.c_int`` -> ``'i'``), or the code as given."""
    return getattr(typecode_or_type, "_type_", typecode_or_type)


def cpu_count() -> int:
    """The number of worker threads of the current cluster (the cores a ``Pool()`` uses)."""
    from .cluster import session

    found = session.resolve()
    if hasattr(found, "nthreads") and not callable(found.nthreads):
        return max(int(found.nthreads), 1)
    return max(sum(found.nthreads().values()), 1)


def parent_process() -> Any:
    """As :func:`multiprocessing.parent_process` (``None`` in the notebook)."""
    return _std.parent_process()


def get_start_method(allow_none: bool = False) -> str | None:
    """The start method set with :func:`set_start_method` (it changes nothing on a cluster)."""
    if _start_method is None and not allow_none:
        return "spawn"
    return _start_method


def set_start_method(method: str | None, force: bool = False) -> None:
    """Accepted: a cluster's processes are tasks on its workers, whatever the method."""
    global _start_method
    if _start_method is not None and not force:
        raise RuntimeError("context has already been set")
    if method is not None and method not in get_all_start_methods():
        raise ValueError(f"cannot find context for {method!r}")
    _start_method = method


def get_all_start_methods() -> list[str]:
    return _std.get_all_start_methods()


def get_context(method: str | None = None) -> Any:
    """This module (its names are the context's), for any start method ``multiprocessing`` knows."""
    if method is not None and method not in get_all_start_methods():
        raise ValueError(f"cannot find context for {method!r}")
    import sys

    return sys.modules[__name__]


def freeze_support() -> None:
    """Accepted (a no-op, as on every system but frozen Windows programs)."""


def set_executable(executable: str) -> None:
    """Accepted: workers run the cluster's own Python."""


def set_forkserver_preload(module_names: list[str]) -> None:
    """Accepted: there is no fork server."""


def allow_connection_pickling() -> None:
    """Accepted: connections always pickle."""


get_logger = _std.get_logger
log_to_stderr = _std.log_to_stderr
