"""Bounds what the scheduler keeps of the jobs topic: the item lists of finished sweeps, oldest first.

The scheduler keeps the last ``distributed.admin.low-level-log-length``
(1,000) events of every topic, whatever their size.  A finished
``%%parallel`` job's message carries its item list (up to 2,000 items with
their configs), so 1,000 job messages held about 300,000 items: ~470 MB in a
kernel that runs its local cluster's scheduler (issue 37).  The Jupyter
server needs a job's items once (it keeps them in its own store, bounded per
notebook), and a server that connects later replays the log; so the log
keeps the items of the newest jobs, :data:`KEEP_LOG_ITEMS` in all, and older
messages keep everything but their ``items`` (``item_count`` still says how
many there were).  ``jc.runs()`` reads the kernel's own record
(:mod:`jupyter_cluster.tracking.record`), not this log.

:class:`JobLogTrim` is a scheduler plugin, registered by the first message
with items that a client publishes (:func:`ensure`); a scheduler that cannot
load it (no jupyter_cluster there) keeps its log as Dask does.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

from .topic_names import JOBS_TOPIC

logger = logging.getLogger(__name__)

#: Items of finished jobs the scheduler's jobs log keeps in all (the newest job's always, whole).
KEEP_LOG_ITEMS = 20_000
PLUGIN_NAME = "jupyter-cluster-job-log"

_registered: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def trim(events: Any, keep: int = KEEP_LOG_ITEMS) -> int:
    """Drop ``items`` from the oldest job messages of ``events`` (a deque of ``(time, msg)``, oldest first) beyond ``keep``.

    The newest message with items keeps them whatever their number.  A
    trimmed event is replaced by a copy without ``items``, same time (a
    reader that follows the topic tells events apart by it): the message
    itself is never changed, since a backlog being sent may be reading it.
    Returns the items left.
    """
    total = 0
    first = True
    drop = []
    for k in range(len(events) - 1, -1, -1):
        ts, msg = events[k]
        items = msg.get("items") if isinstance(msg, dict) else None
        if not isinstance(items, (list, tuple)):  # msgpack hands lists over as tuples
            continue
        if first or total + len(items) <= keep:
            total += len(items)
            first = False
        else:
            drop.append(k)
    for k in drop:
        ts, msg = events[k]
        events[k] = (ts, {f: v for f, v in msg.items() if f != "items"})
    return total


class JobLogTrim(SchedulerPlugin):
    """Scheduler plugin: after each jobs-topic message with items, :func:`trim` the topic's log."""

    idempotent = True
    name = PLUGIN_NAME

    def __init__(self, keep: int = KEEP_LOG_ITEMS):
        self.keep = keep
        self.scheduler: Any = None

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self._trim()

    def log_event(self, topic: str, msg: Any) -> None:
        if topic == JOBS_TOPIC and isinstance(msg, dict) and "items" in msg:
            self._trim()

    def _trim(self) -> None:
        broker = getattr(self.scheduler, "_broker", None)
        topic = getattr(broker, "_topics", {}).get(JOBS_TOPIC) if broker is not None else None
        if topic is not None:
            trim(topic.events, self.keep)


async def ensure(client: Any) -> None:
    """Register :class:`JobLogTrim` on ``client``'s scheduler once (on the client's loop; failures only logged)."""
    if _registered.get(client):
        return
    _registered[client] = True
    try:
        from distributed.protocol.pickle import dumps

        await client.scheduler.register_scheduler_plugin(
            plugin=dumps(JobLogTrim(KEEP_LOG_ITEMS)), name=PLUGIN_NAME, idempotent=True
        )
    except Exception:  # noqa: BLE001 - a scheduler without jupyter_cluster keeps Dask's log as it is
        logger.debug("the jobs log's trim could not be registered", exc_info=True)
