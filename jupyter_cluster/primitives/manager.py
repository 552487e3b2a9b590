"""``multiprocessing.Manager()`` on the cluster, and ``Value``/``Array`` through it.

A manager's dict, list, Namespace and values live on the scheduler
(:mod:`.shared_store`) as real Python objects; a proxy sends each method call
there, so every process holding a copy of the proxy sees one object.  As with
``multiprocessing``'s proxies, ``d["k"].append(1)`` changes a copy: assign
the value back.  Its locks, events, queues are the cluster's own
(:mod:`.sync`, :mod:`.channels`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import cloudpickle

from .channels import JoinableQueue, Queue
from .managed_methods import FORWARDED
from .shared import Shared
from .sync import Barrier, BoundedSemaphore, Condition, Event, Lock, RLock, Semaphore


class _Proxy(Shared):
    _prefix = "managed"
    _kind = ""

    def __init__(self, initial: Any, manager: SyncManager | None = None, *, client: Any = None):
        self._bind(client if client is not None else (manager._client if manager is not None else None))
        self._call("obj_create", name=self._name, kind=self._kind, data=cloudpickle.dumps(initial))
        if manager is not None:
            manager._names.append(self._name)

    def _callmethod(self, method: str, args: tuple = (), kwds: dict | None = None) -> Any:
        reply = self._call("obj_call", name=self._name, method=method, data=cloudpickle.dumps((args, kwds or {})))
        if reply["status"] == "missing":
            raise self._missing()
        value = cloudpickle.loads(reply["data"])
        if reply["status"] == "error":
            raise value
        return value

    def _getvalue(self) -> Any:
        """A copy of the shared object."""
        return self._callmethod("copy")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._name}>"

    def __str__(self) -> str:
        return self._callmethod("__repr__")


def _forward(*names: str) -> dict[str, Any]:
    def make(name: str) -> Any:
        def method(self: _Proxy, *args: Any, **kwds: Any) -> Any:
            return self._callmethod(name, args, kwds)

        method.__name__ = name
        return method

    return {name: make(name) for name in names}


class DictProxy(_Proxy):
    """A manager's ``dict()``."""

    _kind = "dict"
    locals().update(_forward(*FORWARDED["dict"]))

    def __iter__(self) -> Iterator[Any]:
        keys = list(self._callmethod("keys"))  # now, not at the first next(): as a dict's own iterator

        def walk() -> Iterator[Any]:
            for key in keys:
                if self._callmethod("__len__") != len(keys):
                    raise RuntimeError("dictionary changed size during iteration")
                yield key

        return walk()

    def __eq__(self, other: object) -> bool:
        return self._getvalue() == (other._getvalue() if isinstance(other, DictProxy) else other)

    __hash__ = None  # type: ignore[assignment]


class ListProxy(_Proxy):
    """A manager's ``list()``."""

    _kind = "list"
    locals().update(_forward(*FORWARDED["list"]))

    def __iter__(self) -> Iterator[Any]:
        index = 0  # item by item, as a list's own iterator: it sees changes made meanwhile
        while True:
            try:
                yield self._callmethod("__getitem__", (index,))
            except IndexError:
                return
            index += 1

    def __iadd__(self, other: Any) -> ListProxy:
        self._callmethod("extend", (list(other),))
        return self

    def __imul__(self, n: int) -> ListProxy:
        self._callmethod("__imul__", (n,))
        return self

    def __add__(self, other: Any) -> list:
        return self._getvalue() + list(other)

    def __mul__(self, n: int) -> list:
        return self._getvalue() * n

    def __eq__(self, other: object) -> bool:
        return self._getvalue() == (other._getvalue() if isinstance(other, ListProxy) else other)

    __hash__ = None  # type: ignore[assignment]


class NamespaceProxy(_Proxy):
    """A manager's ``Namespace()``: attributes shared by every process."""

    _kind = "namespace"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return self._callmethod("__getattribute__", (name,))

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            self._callmethod("__setattr__", (name, value))

    def __delattr__(self, name: str) -> None:
        if name.startswith("_"):
            object.__delattr__(self, name)
        else:
            self._callmethod("__delattr__", (name,))

    def __repr__(self) -> str:
        return self._callmethod("__repr__").replace("namespace(", "Namespace(", 1)

    __str__ = __repr__


#: Value's typecodes (the array module's and ctypes' short names) -> the Python type they hold.
_TYPES = {
    "c": bytes,
    "u": str,
    "b": int,
    "B": int,
    "h": int,
    "H": int,
    "i": int,
    "I": int,
    "l": int,
    "L": int,
    "q": int,
    "Q": int,
    "f": float,
    "d": float,
}


def _convert(typecode: Any, value: Any) -> Any:
    kind = _TYPES.get(typecode) if isinstance(typecode, str) else None
    if kind is int or kind is float:
        return kind(value)
    return value


def _zero(typecode: Any) -> Any:
    kind = _TYPES.get(typecode) if isinstance(typecode, str) else None
    return {int: 0, float: 0.0, bytes: b"\x00", str: ""}.get(kind, 0)  # type: ignore[arg-type]


class _Synchronized:
    """``get_lock()``/``get_obj()`` and the lock's methods of a ``Value`` or ``Array`` made with a lock.

    Made with ``lock=False`` (``RawValue``, ``RawArray``) it has none of them, as in multiprocessing.
    """

    _lock: Any
    _raw_name = "RawValue"

    @property
    def get_lock(self) -> Any:
        """The lock's getter; absent (``AttributeError``) when made with ``lock=False``."""
        if self._lock is None:
            raise AttributeError(f"'{self._raw_name}' object has no attribute 'get_lock'")
        lock = self._lock
        return lambda: lock

    @property
    def get_obj(self) -> Any:
        """The object's getter; absent, as ``get_lock``, without a lock."""
        if self._lock is None:
            raise AttributeError("a Raw value has no attribute 'get_obj'")
        return lambda: self

    def acquire(self, *args: Any) -> bool:
        return self.get_lock().acquire(*args)

    def release(self) -> None:
        self.get_lock().release()

    def __enter__(self) -> bool:
        return self.get_lock().__enter__()

    def __exit__(self, *exc: Any) -> None:
        self.get_lock().__exit__(*exc)


class ValueProxy(_Synchronized, _Proxy):
    """A ``Value``: ``.value`` read and written through the scheduler; ``get_lock()`` when made with a lock."""

    _kind = "value"

    def __init__(
        self,
        typecode: Any,
        value: Any = None,
        lock: Any = True,
        manager: SyncManager | None = None,
        *,
        client: Any = None,
    ):
        self._typecode = typecode
        super().__init__(_convert(typecode, _zero(typecode) if value is None else value), manager, client=client)
        self._lock = _lock_of(lock, self._client)

    def get(self) -> Any:
        return self._callmethod("get")

    def set(self, value: Any) -> None:
        self._callmethod("set", (_convert(self._typecode, value),))

    value = property(get, set)

    def __repr__(self) -> str:
        return f"<Value({self._typecode!r}, {self.get()!r})>"


class ArrayProxy(_Synchronized, ListProxy):
    """An ``Array``: a fixed-length list of one typecode's values; ``get_lock()`` when made with a lock."""

    _raw_name = "RawArray"

    def __init__(
        self,
        typecode: Any,
        size_or_initializer: Any,
        lock: Any = True,
        manager: SyncManager | None = None,
        *,
        client: Any = None,
    ):
        self._typecode = typecode
        if isinstance(size_or_initializer, int):
            initial = [_zero(typecode)] * size_or_initializer
        else:
            initial = [_convert(typecode, v) for v in size_or_initializer]
        self._length = len(initial)
        super().__init__(initial, manager, client=client)
        self._lock = _lock_of(lock, self._client)

    def __len__(self) -> int:
        return self._length

    def __setitem__(self, index: Any, value: Any) -> None:
        if isinstance(index, slice):
            value = [_convert(self._typecode, v) for v in value]
            if len(range(*index.indices(self._length))) != len(value):
                raise ValueError("Can only assign sequence of same size")
        else:
            value = _convert(self._typecode, value)
        self._callmethod("__setitem__", (index, value))

    def __delitem__(self, index: Any) -> None:
        raise TypeError("Array doesn't support item deletion")

    def __repr__(self) -> str:
        return f"<Array({self._typecode!r}, {self._getvalue()!r})>"


def _lock_of(lock: Any, client: Any) -> Any:
    """``Value``'s ``lock`` argument: True or None (a new RLock), False (none) or a lock (``acquire``/``release``)."""
    if lock is True or lock is None:
        return RLock(client=client)
    if lock is False:
        return None
    if not hasattr(lock, "acquire"):
        raise AttributeError(f"{type(lock).__name__!r} object has no attribute 'acquire'")
    return lock


class SyncManager:
    """``multiprocessing.Manager()``'s object: shared objects served from the cluster.

    ``start()``/``shutdown()`` and the ``with`` block are accepted; ``shutdown()``
    deletes the manager's dicts, lists, namespaces and values from the scheduler.
    """

    def __init__(self, address: Any = None, authkey: Any = None, *, client: Any = None, ctx: Any = None):
        if client is None:
            from ..cluster import session  # not at import: a task needs no notebook side

            client = session.client_of()
        self._client = client
        self._names: list[str] = []
        self._state = "started"
        self._lock = threading.Lock()

    def start(self, initializer: Any = None, initargs: tuple = ()) -> None:
        """Accepted: the manager is served by the cluster already (``initializer`` runs here, now)."""
        if initializer is not None:
            initializer(*initargs)
        self._state = "started"

    def connect(self) -> None:
        """Accepted for compatibility."""

    def join(self, timeout: float | None = None) -> None:
        """Accepted for compatibility."""

    def shutdown(self) -> None:
        """Delete the manager's shared objects from the scheduler."""
        with self._lock:
            names, self._names = self._names, []
            self._state = "shutdown"
        if names:
            from .shared import _register

            _register(self._client)

            async def release() -> None:
                await self._client.scheduler.jc_shared_release(names=names)

            try:
                self._client.sync(release)
            except Exception:  # the cluster is gone, and the objects with it
                pass

    def __enter__(self) -> SyncManager:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def dict(self, *args: Any, **kwargs: Any) -> DictProxy:
        return DictProxy(dict(*args, **kwargs), self)

    def list(self, sequence: Any = ()) -> ListProxy:
        return ListProxy(list(sequence), self)

    def Namespace(self, **kwargs: Any) -> NamespaceProxy:  # noqa: N802 (multiprocessing's names)
        return NamespaceProxy(kwargs, self)

    def Value(self, typecode: Any, value: Any, lock: bool = True) -> ValueProxy:  # noqa: N802
        return ValueProxy(typecode, value, lock, self)

    def Array(self, typecode: Any, sequence: Any, lock: bool = True) -> ArrayProxy:  # noqa: N802
        return ArrayProxy(typecode, sequence, lock, self)

    def Queue(self, maxsize: int = 0) -> Queue:  # noqa: N802
        return Queue(maxsize, client=self._client)

    def JoinableQueue(self, maxsize: int = 0) -> JoinableQueue:  # noqa: N802
        return JoinableQueue(maxsize, client=self._client)

    def Lock(self) -> Lock:  # noqa: N802
        return Lock(client=self._client)

    def RLock(self) -> RLock:  # noqa: N802
        return RLock(client=self._client)

    def Semaphore(self, value: int = 1) -> Semaphore:  # noqa: N802
        return Semaphore(value, client=self._client)

    def BoundedSemaphore(self, value: int = 1) -> BoundedSemaphore:  # noqa: N802
        return BoundedSemaphore(value, client=self._client)

    def Condition(self, lock: Any = None) -> Condition:  # noqa: N802
        return Condition(lock, client=self._client)

    def Event(self) -> Event:  # noqa: N802
        return Event(client=self._client)

    def Barrier(self, parties: int, action: Any = None, timeout: float | None = None) -> Barrier:  # noqa: N802
        return Barrier(parties, action, timeout, client=self._client)
