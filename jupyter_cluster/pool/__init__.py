"""``jupyter_cluster.Pool``: the ``multiprocessing.Pool`` API on the current cluster.

- :mod:`.worker`: what runs on the workers (the task, the initializer, failures as data);
- :mod:`.results`: ``ApplyResult``, ``MapResult`` and the imap iterators;
- :mod:`.pool`: the pool, its states and its result thread.

Worker processes import only :mod:`.worker` (to unpickle a pool's tasks): the
other names are imported on first use, so a worker never loads the notebook side.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._core.lazy import attach as _attach

if TYPE_CHECKING:
    from .pool import Pool
    from .results import ApplyResult, AsyncResult, IMapIterator, IMapUnorderedIterator, MapResult

__all__ = ["Pool", "AsyncResult", "ApplyResult", "MapResult", "IMapIterator", "IMapUnorderedIterator"]

_WHERE = {
    "Pool": ".pool", "INIT": ".pool", "RUN": ".pool", "CLOSE": ".pool", "TERMINATE": ".pool",
    "STOP_WAIT_SECONDS": ".pool", "AsyncResult": ".results", "ApplyResult": ".results",
    "MapResult": ".results", "IMapIterator": ".results", "IMapUnorderedIterator": ".results",
}  # fmt: skip


__getattr__, __dir__ = _attach(__name__, _WHERE)
