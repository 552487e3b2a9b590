"""How a map hands its chunks to a cluster: the :class:`Dispatcher` protocol and the typed :class:`MapEvent`\\ s it reports.

A map (:class:`.job.MapJob`) knows nothing of Dask: it cuts its input into
:class:`Chunk`\\ s and asks its dispatcher how many it may send now
(:meth:`Dispatcher.room`), sends them (:meth:`Dispatcher.send`, one handle
per chunk) and hears what became of them (:meth:`Dispatcher.poll`, a list
of typed :class:`MapEvent`\\ s: :class:`Done`, :class:`Failed`, :class:`Died`,
:class:`Killed`, :class:`Retry`, :class:`Cancelled`, :class:`Fallback`).  Two dispatchers implement it:

- :class:`.direct.DirectDispatcher` (the default): one lease task per worker
  thread, batches sent to the leases over Dask's comm;
- :class:`.tasks.TaskDispatcher` (the fallback, and ``--all-workers``): one
  Dask task per chunk.

The map picks one on its first step; the direct one may ask to be swapped
for the other (:class:`Fallback`) when the workers turn out to be
unreachable from here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from .protocol import ChunkResult, MapRun


class MapSpec(NamedTuple):
    """What either path needs of a map to send its chunks: made once per map, handed whole to its dispatcher."""

    client: Any  # distributed.Client
    map_id: str  # names the map's lease tasks or chunk tasks
    run: MapRun  # what the workers need: the function, its cache token, star, retries, timeout, capture
    shared: Any  # .cluster.Scattered: the map's large values (and the function, "__fn__", when it is large)
    resources: dict | None  # Dask resources each lease or chunk needs
    concurrency: int | None  # most chunks running at once (None: every worker thread)
    check: Callable[[], None]  # raises once the scheduler is lost (called while waiting)


class Chunk:
    """A run of consecutive input items sent as one batch (direct path) or one task (task path)."""

    __slots__ = ("start", "items", "suspect", "resubmits", "pin", "budget", "deaths")

    def __init__(
        self,
        start: int,
        items: list,
        suspect: bool = False,
        pin: str | None = None,
        budget: float | None = None,
        deaths: int = 0,
    ):
        self.start = start  # input index of items[0]
        self.items = items
        self.suspect = suspect  # one item of a chunk that outlived too many workers (:mod:`.faults`)
        self.resubmits = 0  # times the cluster cancelled it without being asked (task path)
        self.pin = pin  # the worker it must run on (--all-workers)
        self.budget = budget  # seconds after which the worker stops and sends the rest back
        self.deaths = deaths  # worker processes lost while running it (direct path)


@dataclass(frozen=True, slots=True)
class MapEvent:
    """Something a dispatcher reports to its map (:meth:`Dispatcher.prepare`, :meth:`Dispatcher.poll`).

    One class per outcome, each with the fields it needs and no other: the
    map's loop handles them in one dispatch on the class
    (:meth:`.job.MapJob._handle_event`), as distributed's worker state
    machine handles its ``StateMachineEvent`` subclasses.
    """


@dataclass(frozen=True, slots=True)
class ChunkEvent(MapEvent):
    """What became of one sent chunk; ``handle`` is what :meth:`Dispatcher.send` returned for it."""

    handle: Any


@dataclass(frozen=True, slots=True)
class Done(ChunkEvent):
    """The chunk ran (its first ``len(result.values)`` items: fewer when its budget ran out)."""

    result: ChunkResult


@dataclass(frozen=True, slots=True)
class Failed(ChunkEvent):
    """The batch or task failed as a whole, not one item (items or results that could not be (de)serialised)."""

    error: BaseException


@dataclass(frozen=True, slots=True)
class Died(ChunkEvent):
    """The worker process running it died: counts against the chunk (:mod:`.faults`)."""


@dataclass(frozen=True, slots=True)
class Killed(ChunkEvent):
    """Dask gave up on it, its workers kept dying (task path): ``error`` is Dask's ``KilledWorker``."""

    error: BaseException


@dataclass(frozen=True, slots=True)
class Retry(ChunkEvent):
    """It did not run, or may run unseen: send it again, nobody to blame."""


@dataclass(frozen=True, slots=True)
class Cancelled(ChunkEvent):
    """The cluster cancelled it without being asked (task path): send it again, counted."""


@dataclass(frozen=True, slots=True)
class Fallback(MapEvent):
    """The dispatcher cannot go on here (the workers are unreachable): the map swaps it for the task path."""


class Counters(NamedTuple):
    """What a dispatcher placed and sent so far (:meth:`Dispatcher.stats`; all 0 on the task path)."""

    placed: int = 0  # lease tasks this map placed (``MapJob.leases``)
    reused: int = 0  # idle leases of an earlier map it took over
    relayed: int = 0  # relay messages sent, each with the batches of a group of workers (``MapJob.relays``)
    early_sent: int = 0  # batches sent to a lease before it attached


class Dispatcher(Protocol):
    """Sends a map's chunks to the cluster and reports what became of them.

    Every method runs on the map's thread.  ``handle``\\ s are opaque to the
    map: it keeps ``handle -> Chunk`` for the chunks in flight and forgets a
    handle once an event about it was handled (later events about it are
    ignored, so every result is taken once).
    """

    #: ``"direct"`` or ``"tasks"`` (``MapJob.path``).
    name: str
    #: What one sent chunk is called in messages (``"batch"``, ``"task"``).
    unit: str
    #: Whether the chunks run on worker threads the map holds between chunks (leases): a task that
    #: waits for a thread may wait behind them (:class:`.threads_watch.ThreadsWatch` looks for it).
    holds_threads: bool

    def threads(self) -> int:
        """Worker threads the map's chunks are spread over (sizes its chunks)."""
        ...

    def room(self, in_flight: int) -> int:
        """How many more chunks may be sent now, with ``in_flight`` out."""
        ...

    def sizing(self, remaining: int | None, round_remaining: int | None, per_item: float | None, idle: bool) -> dict:
        """Keyword arguments for :func:`.planner.next_size` besides ``per_item`` and ``probe``.

        ``remaining``: items left to send now; ``round_remaining``: as it
        was when this round of sends began; ``idle``: nothing in flight.
        """
        ...

    def prepare(self, more_work: bool) -> list[MapEvent]:
        """Get ready to send (place or replace workers' leases when due); events found meanwhile."""
        ...

    def send(self, chunks: list[Chunk]) -> list[Any]:
        """Send ``chunks`` (at most :meth:`room`); their handles, in order."""
        ...

    def poll(self, timeout: float) -> list[MapEvent]:
        """What happened since the last call, waiting up to ``timeout`` seconds for something."""
        ...

    def cancel(self, handle: Any) -> None:
        """Stop one sent chunk (the map gave up on it)."""
        ...

    def close(self, pending: list[Any], keep: bool = False) -> None:
        """Stop: cancel ``pending`` (handles still in flight); ``keep``: the map finished (reusable leases stay)."""
        ...

    def forget_function(self) -> None:
        """Drop the map's pickled function (the map ended)."""
        ...

    def stats(self) -> Counters:
        """What it placed and sent so far (read on demand, never on the send path)."""
        ...
