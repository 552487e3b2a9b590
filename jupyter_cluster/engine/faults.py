"""Which item kills workers: suspects, poison, and how many worker deaths a chunk is allowed.

As Dask does with a task: a chunk is run again until more workers died
running it than ``allowed-failures``.  Then which item kills workers is not
known, so each item is run alone, one at a time ("suspects", counting
afresh); a suspect that again outlives ``allowed-failures`` workers fails with
:class:`~jupyter_cluster.errors.WorkerLostError` ("poison").  Innocent items
caught in the deaths of others (a worker killed from outside) therefore need
as many deaths on the direct path as on the task path before they are blamed.
"""

from __future__ import annotations

import reprlib
from collections import deque
from typing import Any

from ..errors import WorkerLostError
from .dispatch import Chunk

_abbrev = reprlib.Repr()
_abbrev.maxstring = 60
_abbrev.maxother = 60
_abbrev.maxlist = _abbrev.maxtuple = _abbrev.maxdict = _abbrev.maxset = 6


def abbreviate(value: Any) -> str:
    """A short repr of an item for messages."""
    try:
        return _abbrev.repr(value)
    except Exception:
        return f"<{type(value).__qualname__}>"


class Faults:
    """One map's suspects: items split off chunks whose workers kept dying, run one at a time.

    Parameters
    ----------
    allowed : callable
        Returns Dask's ``allowed-failures`` for the map's cluster; asked
        once, when a worker first dies (every chunk of a map is judged by the
        same number).
    """

    def __init__(self, allowed: Any):
        self._allowed_of = allowed
        self._allowed: int | None = None
        #: Suspect chunks (one item each) waiting to run, the next first.
        self.suspects: deque[Chunk] = deque()
        #: A suspect is in flight (only one at a time: a death is then its own).
        self.running = False

    def allowed(self) -> int:
        """Dask's ``allowed-failures``, looked up once per map."""
        if self._allowed is None:
            self._allowed = int(self._allowed_of())
        return self._allowed

    def next_suspect(self) -> Chunk | None:
        """The suspect to send now, if one waits and none runs."""
        if self.suspects and not self.running:
            self.running = True
            return self.suspects.popleft()
        return None

    def left(self, chunk: Chunk) -> None:
        """``chunk`` is no longer in flight (it ended, or goes back to a queue)."""
        if chunk.suspect:
            self.running = False

    def split(self, chunk: Chunk, pin: str | None = None) -> None:
        """Run each item of ``chunk`` alone, as a suspect."""
        for k, item in enumerate(chunk.items):
            self.suspects.append(Chunk(chunk.start + k, [item], suspect=True, pin=pin))

    def died(self, chunk: Chunk) -> Chunk | WorkerLostError | None:
        """A worker process died running ``chunk`` (direct path).

        Returns the chunk to run again, the error to fail its one item with,
        or None (it was split into suspects).
        """
        chunk.deaths += 1
        if chunk.deaths <= self.allowed():
            return chunk
        if not chunk.suspect:
            self.split(chunk)
            return None
        return poison(chunk, chunk.deaths)

    def killed(self, chunk: Chunk, exc: BaseException) -> WorkerLostError | None:
        """Dask gave up on ``chunk`` (``KilledWorker``, task path): split it, or blame its one item.

        Dask blames every task queued on a dying worker, so a killed chunk
        may be innocent: each of its items is re-run as a suspect, one at a
        time; a suspect that still ends in ``KilledWorker`` is the item that
        kills workers.
        """
        if not chunk.suspect:
            self.split(chunk, pin=chunk.pin)
            return None
        return poison(chunk, getattr(exc, "allowed_failures", 0) + 1)

    def clear(self) -> None:
        self.suspects.clear()


def poison(chunk: Chunk, deaths: int) -> WorkerLostError:
    """The error for a suspect chunk's one item: it killed ``deaths`` worker processes (either path)."""
    return WorkerLostError(
        f"item {chunk.start} ({abbreviate(chunk.items[0])}) killed {deaths} worker processes that ran it "
        "(it crashed its process or ran out of memory), so it was not tried again; the cluster is still usable."
    )
