"""The kernel's side of :func:`~jupyter_cluster.telemetry.producer.report`: the notebook's own reports.

A report made in the notebook is in this kernel's store at once, and goes to
the current cluster's scheduler every flush interval (for the sidebar and
other kernels), on the ticker thread.  The session layer installs a
:class:`KernelSink` that knows how to find the current cluster; the producer
(:mod:`.report`, which also runs on every worker) knows nothing of sessions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._core import ticker
from .hub import attach
from .producer import _flush_interval, _producer, publish
from .topic_store import store


class KernelSink:
    """The notebook's reports: stored here at once, sent through the current cluster's client.

    Parameters
    ----------
    current : callable
        Returns the kernel's current cluster handle, or None.
    """

    def __init__(self, current: Callable[[], Any]):
        self._current = current

    def handle(self) -> Any:
        """The current cluster handle, or None."""
        return self._current()

    def _live(self) -> Any:
        try:
            h = self._current()
        except Exception:
            return None
        return None if h is None or h.closed else h

    def add(self, topic: str, seq: int, record: dict, arm: bool) -> None:
        store(topic).add(_producer.source, seq, [record], worker="kernel")
        if arm:
            ticker.every(_flush_interval(), self.flush)
            handle = self._live()
            if handle is not None:
                attach(handle.client)

    def flush(self) -> bool:
        """Send the buffered reports through the current cluster (dropped when there is none)."""
        handle = self._live()
        batch = _producer.take(discard=handle is None)
        for dask_topic, msg in batch:
            publish(handle.client, dask_topic, msg)
        return False  # a ticker callback: one call per arming
