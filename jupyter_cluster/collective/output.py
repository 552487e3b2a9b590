"""The ranks' printed output in the notebook: relayed live while the cell runs, the rest from the results.

Each rank's worker sends its new output on :data:`~jupyter_cluster.telemetry.topic_names.SPMD_OUTPUT_TOPIC`
(:class:`~jupyter_cluster.collective.task._Capture`); one subscription per client (:class:`_OutputRouter`)
queues the chunks per job, :class:`LiveOutput` passes them on while a run waits, and
:class:`OutputPrinter` prints whole lines labelled ``[rank r]``, each once.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..telemetry.topic_names import SPMD_OUTPUT_TOPIC

if TYPE_CHECKING:
    from distributed import Client


class _OutputRouter:
    """One subscription per client to the ranks' live output; chunks are queued per job."""

    def __init__(self, client: Client):
        self.queues: dict[str, Any] = {}
        self.lock = threading.Lock()
        client.subscribe_topic(SPMD_OUTPUT_TOPIC, self._on_event)

    def _on_event(self, event) -> None:  # on the client's event loop
        msg = event[1] if isinstance(event, (tuple, list)) and len(event) == 2 else event
        if not isinstance(msg, dict):
            return
        with self.lock:
            queue = self.queues.get(str(msg.get("job")))
        if queue is not None:
            queue.append(msg)

    def register(self, job: str) -> deque:
        queue: deque = deque()
        with self.lock:
            self.queues[job] = queue
        return queue

    def unregister(self, job: str) -> None:
        with self.lock:
            self.queues.pop(job, None)


# client id -> its router
_routers: dict[str, _OutputRouter] = {}
_routers_lock = threading.Lock()


def _router(client: Client) -> _OutputRouter | None:
    with _routers_lock:
        router = _routers.get(client.id)
        if router is None:
            try:
                router = _routers[client.id] = _OutputRouter(client)
            except Exception:  # no live output; the results still carry it
                return None
        return router


class LiveOutput:
    """One run's live output: the ranks' chunks, passed to ``on_output.live`` while the run waits.

    ``on_output`` without a ``live`` method (or a client whose output cannot be
    subscribed to) gets the output from the results only.
    """

    def __init__(self, client: Client, job: str, on_output: Any):
        self.job = job
        self.show: Callable[[int, int, str], None] | None = getattr(on_output, "live", None)
        self.wants: Callable[[int], bool] = getattr(on_output, "wants", lambda rank: False)
        self.router = _router(client) if self.show is not None else None
        self.chunks = self.router.register(job) if self.router is not None else None

    def streams(self, rank: int) -> bool:
        """Whether ``rank``'s worker should send its output as it grows."""
        return self.chunks is not None and self.wants(rank)

    def relay(self) -> None:
        """Pass on the chunks that came in."""
        while self.chunks and self.show is not None:
            chunk = self.chunks.popleft()
            self.show(chunk["rank"], chunk["offset"], chunk["text"])

    def close(self, relay: bool = True) -> None:
        """Stop listening; with ``relay``, pass on what came in first."""
        if self.router is None:
            return
        if relay:
            self.relay()
        self.router.unregister(self.job)


class OutputPrinter:
    """Prints the chosen ranks' output (and every failing rank's), each line labelled ``[rank r]``.

    Lines appear as the ranks print them (:meth:`live`, fed from the workers'
    stream); what had not arrived when the cell ended is printed from the
    result (:meth:`__call__`), so every line appears once, in order per rank.
    """

    def __init__(self, show: str | int | list[int] | None = 0):
        self.show = show
        self._consumed: dict[int, int] = {}
        self._partial: dict[int, str] = {}
        self._pending: dict[int, dict[int, str]] = {}

    def wants(self, rank: int) -> bool:
        s = self.show
        if s is None:
            return False
        if s == "all":
            return True
        if isinstance(s, int):
            return rank == s
        return rank in set(s)

    def live(self, rank: int, offset: int, text: str) -> None:
        """A chunk of ``rank``'s output starting at character ``offset``; whole lines are printed now."""
        if not self.wants(rank):
            return
        pending = self._pending.setdefault(rank, {})
        pending[offset] = text
        while True:
            got = self._consumed.get(rank, 0)
            starts = [o for o in pending if o <= got]
            if not starts:
                return
            for o in starts:
                chunk = pending.pop(o)
                if o + len(chunk) > got:
                    self._emit(rank, chunk[got - o :], failed=False, final=False)
                    break

    def _emit(self, rank: int, text: str, failed: bool, final: bool) -> None:
        self._consumed[rank] = self._consumed.get(rank, 0) + len(text)
        lines = (self._partial.pop(rank, "") + text).split("\n")
        if not final:
            self._partial[rank] = lines.pop()  # an unfinished line waits for the rest
        elif lines and lines[-1] == "":
            lines.pop()
        tag = f"[rank {rank}{', failed' if failed else ''}] "
        for line in lines:
            print(tag + line)

    def __call__(self, rank: int, text: str, failed: bool) -> None:
        """The cell ended: print what of ``rank``'s whole output ``text`` was not printed yet."""
        if not (failed or self.wants(rank)):
            return
        self._pending.pop(rank, None)
        rest = text[self._consumed.get(rank, 0) :]
        if rest or self._partial.get(rank):
            self._emit(rank, rest, failed, final=True)
