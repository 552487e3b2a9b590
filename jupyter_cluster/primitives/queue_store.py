"""The scheduler side of ``jupyter_cluster.Queue``: a scheduler plugin holding the queues.

Kept apart from :mod:`.dqueue` so that importing ``jupyter_cluster`` does not
import ``distributed``; the scheduler imports this module when the plugin is
registered.
"""

from __future__ import annotations

import asyncio
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

PLUGIN = "jupyter-cluster-queues"


class QueueStore(SchedulerPlugin):
    """Scheduler plugin holding every ``jupyter_cluster.Queue`` of a cluster.

    Its handlers answer timeouts with a status instead of an exception.
    """

    idempotent = True  # registering again from another client keeps the queues
    name = PLUGIN

    def __init__(self) -> None:
        self.queues: dict[str, asyncio.Queue] = {}
        # Items put and not yet marked done (JoinableQueue.task_done), and the event join() waits on.
        self.unfinished: dict[str, int] = {}
        self.all_done: dict[str, asyncio.Event] = {}

    async def start(self, scheduler: Any) -> None:
        scheduler.handlers.update(
            {
                "jc_queue_create": self.create,
                "jc_queue_put": self.put,
                "jc_queue_get": self.get,
                "jc_queue_qsize": self.qsize,
                "jc_queue_release": self.release,
                "jc_queue_task_done": self.task_done,
                "jc_queue_join": self.join,
            }
        )

    def create(self, name: str, maxsize: int = 0, **_: Any) -> int:
        q = self.queues.get(name)
        if q is None:
            q = self.queues[name] = asyncio.Queue(maxsize=maxsize)
        return q.maxsize

    async def put(self, name: str, data: bytes, timeout: float | None = None, **_: Any) -> str:
        q = self.queues.get(name)
        if q is None:
            return "missing"
        if timeout is not None and timeout <= 0:
            try:
                q.put_nowait(data)
            except asyncio.QueueFull:
                return "full"
            return self._count(name)
        try:
            await asyncio.wait_for(q.put(data), timeout)
        except asyncio.TimeoutError:
            return "full"
        return self._count(name)

    def _count(self, name: str) -> str:
        self.unfinished[name] = self.unfinished.get(name, 0) + 1
        self.all_done.setdefault(name, asyncio.Event()).clear()
        return "ok"

    def task_done(self, name: str, **_: Any) -> str:
        left = self.unfinished.get(name, 0)
        if left <= 0:
            return "too-many"
        self.unfinished[name] = left - 1
        if left == 1:
            self.all_done.setdefault(name, asyncio.Event()).set()
        return "ok"

    async def join(self, name: str, timeout: float | None = None, **_: Any) -> bool:
        if not self.unfinished.get(name, 0):
            return True
        try:
            await asyncio.wait_for(self.all_done.setdefault(name, asyncio.Event()).wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    async def get(self, name: str, timeout: float | None = None, **_: Any) -> dict[str, Any]:
        q = self.queues.get(name)
        if q is None:
            return {"status": "missing"}
        if timeout is not None and timeout <= 0:
            try:
                return {"status": "ok", "data": q.get_nowait()}
            except asyncio.QueueEmpty:
                return {"status": "empty"}
        try:
            return {"status": "ok", "data": await asyncio.wait_for(q.get(), timeout)}
        except asyncio.TimeoutError:
            return {"status": "empty"}

    def qsize(self, name: str, **_: Any) -> int:
        q = self.queues.get(name)
        return -1 if q is None else q.qsize()

    def release(self, name: str, **_: Any) -> None:
        self.queues.pop(name, None)
        self.unfinished.pop(name, None)
        self.all_done.pop(name, None)
