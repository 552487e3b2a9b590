"""The scheduler side of ``jupyter_cluster.multiprocessing``'s shared objects: one scheduler plugin.

Locks, semaphores, events, conditions and barriers are kept here as asyncio
objects, so that every process of the cluster (the notebook, a task, a
``Process``, a standard ``multiprocessing`` child connected by address) sees
the same one; a ``Condition.wait`` releases its lock and waits for a notify
in one handler, so no notify is missed.  A manager's shared objects (dict,
list, Namespace, Value, Array) live here as real Python objects; their
methods run here, one call at a time, from an allow-list (values arrive
pickled by the cluster's own clients, as ``Client.run_on_scheduler`` calls do).
Kept apart from the client side so that ``import jupyter_cluster`` does not
import ``distributed``.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import cloudpickle
from distributed.diagnostics.plugin import SchedulerPlugin

from .managed_methods import ALLOWED, IN_PLACE

PLUGIN = "jupyter-cluster-shared"


class _Sem:
    """A semaphore, lock ("lock": released too often is an error) or re-entrant lock ("rlock": owned)."""

    def __init__(self, kind: str, value: int, bound: int | None):
        self.kind, self.value, self.bound = kind, value, bound
        self.owner: str | None = None
        self.count = 0
        self.cond = asyncio.Condition()


class _Barrier:
    def __init__(self, parties: int, action: bool):
        self.parties, self.action = parties, action
        self.waiting: list[asyncio.Future] = []
        self.broken = False


class _Box:
    """A value set once (a Process's pid and worker), read with a wait."""

    def __init__(self) -> None:
        self.ready = asyncio.Event()
        self.data: bytes | None = None


class Value:
    """A manager's ``Value``: one value with ``get``/``set``."""

    def __init__(self, value: Any):
        self.value = value

    def get(self) -> Any:
        return self.value

    def set(self, value: Any) -> None:
        self.value = value


class SharedStore(SchedulerPlugin):
    """Scheduler plugin holding the cluster's locks, events, barriers and managers' objects."""

    idempotent = True
    name = PLUGIN

    def __init__(self) -> None:
        self.sems: dict[str, _Sem] = {}
        self.events: dict[str, asyncio.Event] = {}
        self.conds: dict[str, list[asyncio.Future]] = {}
        self.barriers: dict[str, _Barrier] = {}
        self.boxes: dict[str, _Box] = {}
        self.objects: dict[str, tuple[str, Any]] = {}

    async def start(self, scheduler: Any) -> None:
        scheduler.handlers.update({f"jc_shared_{name}": getattr(self, name) for name in _HANDLERS})

    # -- semaphores and locks --------------------------------------------------
    def sem_create(self, name: str, kind: str, value: int, bound: int | None = None, **_: Any) -> None:
        self.sems.setdefault(name, _Sem(kind, value, bound))

    async def sem_acquire(self, name: str, owner: str, timeout: float | None = None, **_: Any) -> str:
        s = self.sems.get(name)
        if s is None:
            return "missing"
        async with s.cond:
            if s.kind == "rlock" and s.owner == owner and s.count:
                s.count += 1
                return "ok"
            if not await _wait_for(s.cond, lambda: s.value > 0, timeout):
                return "timeout"
            s.value -= 1
            s.owner, s.count = owner, 1
            return "ok"

    async def sem_release(self, name: str, owner: str, **_: Any) -> str:
        s = self.sems.get(name)
        if s is None:
            return "missing"
        async with s.cond:
            return self._release(s, owner, all_levels=False)[0]

    def _release(self, s: _Sem, owner: str, all_levels: bool) -> tuple[str, int]:
        if s.kind == "rlock":
            if s.owner != owner or not s.count:
                return "not-owner", 0
            levels = s.count if all_levels else 1
            s.count -= levels
            if s.count:
                return "ok", levels
            s.owner = None
        elif s.kind == "lock" and s.value >= 1:
            return "too-many", 0
        elif s.bound is not None and s.value >= s.bound:
            return "too-many", 0
        s.value += 1
        s.cond.notify()
        return "ok", 1

    def sem_state(self, name: str, **_: Any) -> dict[str, Any] | None:
        s = self.sems.get(name)
        return None if s is None else {"value": s.value, "owner": s.owner, "count": s.count}

    # -- conditions --------------------------------------------------------------
    async def cond_wait(self, name: str, lock: str, owner: str, timeout: float | None = None, **_: Any) -> str:
        s = self.sems.get(lock)
        if s is None:
            return "missing"
        waiter = asyncio.get_running_loop().create_future()
        async with s.cond:
            status, levels = self._release(s, owner, all_levels=True)
            if status != "ok":
                return "not-owner"
            self.conds.setdefault(name, []).append(waiter)  # before anyone can take the lock and notify
        notified = True
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout)
        except asyncio.TimeoutError:
            notified = False
            with contextlib.suppress(ValueError):
                self.conds.get(name, []).remove(waiter)
        async with s.cond:
            await s.cond.wait_for(lambda: s.value > 0)
            s.value -= 1
            s.owner, s.count = owner, levels
        return "ok" if notified else "timeout"

    def cond_notify(self, name: str, n: int | None = None, **_: Any) -> int:
        waiters = self.conds.get(name, [])
        woken = 0
        while waiters and (n is None or woken < n):
            waiter = waiters.pop(0)
            if not waiter.done():
                waiter.set_result(True)
                woken += 1
        return woken

    # -- events ------------------------------------------------------------------
    def event_op(self, name: str, what: str, **_: Any) -> bool:
        event = self.events.setdefault(name, asyncio.Event())
        if what == "set":
            event.set()
        elif what == "clear":
            event.clear()
        return event.is_set()

    async def event_wait(self, name: str, timeout: float | None = None, **_: Any) -> bool:
        event = self.events.setdefault(name, asyncio.Event())
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    # -- barriers ----------------------------------------------------------------
    def barrier_create(self, name: str, parties: int, action: bool = False, **_: Any) -> None:
        self.barriers.setdefault(name, _Barrier(parties, action))

    async def barrier_wait(self, name: str, timeout: float | None = None, **_: Any) -> dict[str, Any]:
        b = self.barriers.get(name)
        if b is None:
            return {"status": "missing"}
        if b.broken:
            return {"status": "broken"}
        index = len(b.waiting)
        if index + 1 == b.parties:
            if b.action:  # the last to arrive runs the action, then releases the others (barrier_release)
                return {"status": "ok", "index": index, "action": True}
            self._pass(b, "ok")
            return {"status": "ok", "index": index}
        waiter = asyncio.get_running_loop().create_future()
        b.waiting.append(waiter)
        try:
            status = await asyncio.wait_for(asyncio.shield(waiter), timeout)
        except asyncio.TimeoutError:
            self._break(b)
            return {"status": "broken"}
        return {"status": status, "index": index}

    def barrier_release(self, name: str, ok: bool, **_: Any) -> None:
        b = self.barriers.get(name)
        if b is not None:
            self._pass(b, "ok") if ok else self._break(b)

    def barrier_op(self, name: str, what: str, **_: Any) -> dict[str, Any]:
        b = self.barriers.get(name)
        if b is None:
            return {"status": "missing"}
        if what == "abort":
            self._break(b)
        elif what == "reset":
            self._break(b)
            b.broken = False
        return {"status": "ok", "broken": b.broken, "n_waiting": len(b.waiting), "parties": b.parties}

    def _pass(self, b: _Barrier, status: str) -> None:
        waiting, b.waiting = b.waiting, []
        for waiter in waiting:
            if not waiter.done():
                waiter.set_result(status)

    def _break(self, b: _Barrier) -> None:
        b.broken = True
        self._pass(b, "broken")

    # -- boxes (a Process's pid) ---------------------------------------------------
    def box_put(self, name: str, data: bytes, **_: Any) -> None:
        box = self.boxes.setdefault(name, _Box())
        box.data = data
        box.ready.set()

    async def box_get(self, name: str, timeout: float | None = None, **_: Any) -> bytes | None:
        box = self.boxes.setdefault(name, _Box())
        try:
            await asyncio.wait_for(box.ready.wait(), timeout)
        except asyncio.TimeoutError:
            return None
        return box.data

    # -- managers' objects -------------------------------------------------------
    def obj_create(self, name: str, kind: str, data: bytes, **_: Any) -> None:
        if kind not in ALLOWED:
            raise ValueError(f"unknown kind of shared object {kind!r}")
        initial = cloudpickle.loads(data)
        if kind == "namespace":
            import types

            obj: Any = types.SimpleNamespace(**initial)
        elif kind == "value":
            obj = Value(initial)
        else:
            obj = {"dict": dict, "list": list}[kind](initial)
        self.objects.setdefault(name, (kind, obj))

    def obj_call(self, name: str, method: str, data: bytes, **_: Any) -> dict[str, Any]:
        found = self.objects.get(name)
        if found is None:
            return {"status": "missing"}
        kind, obj = found
        if method not in ALLOWED[kind]:
            return {
                "status": "error",
                "data": cloudpickle.dumps(AttributeError(f"{kind} proxy has no method {method!r}")),
            }
        args, kwargs = cloudpickle.loads(data)
        try:
            result = getattr(obj, method)(*args, **kwargs)
            if method in IN_PLACE:
                result = None  # the object itself: the caller needs no copy of it
            return {"status": "ok", "data": cloudpickle.dumps(result)}
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller
            return {"status": "error", "data": cloudpickle.dumps(exc)}

    def release(self, names: list[str], **_: Any) -> None:
        for name in names:
            for table in (self.sems, self.events, self.conds, self.barriers, self.boxes, self.objects):
                table.pop(name, None)


async def _wait_for(cond: asyncio.Condition, predicate: Any, timeout: float | None) -> bool:
    if predicate():
        return True
    if timeout is not None and timeout <= 0:
        return False
    try:
        await asyncio.wait_for(cond.wait_for(predicate), timeout)
    except asyncio.TimeoutError:
        return False
    return True


_HANDLERS = (
    "sem_create",
    "sem_acquire",
    "sem_release",
    "sem_state",
    "cond_wait",
    "cond_notify",
    "event_op",
    "event_wait",
    "barrier_create",
    "barrier_wait",
    "barrier_release",
    "barrier_op",
    "box_put",
    "box_get",
    "obj_create",
    "obj_call",
    "release",
)
