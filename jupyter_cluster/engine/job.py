"""One map's state and its dispatch loop (:class:`MapJob`), on either path.

How work flows
--------------
Items are read lazily from the input and grouped into *chunks* (batches),
sized by :mod:`.planner`, and handed to a dispatcher (:mod:`.dispatch`), picked
on the map's first step.  On the direct path (the default,
:mod:`.direct`) a chunk is one message to a lease (:mod:`.worker`): each lease has at most
two chunks outstanding, one running and one queued, so no thread idles and a
generator of 10^6 items never becomes 10^6 messages in flight.  On the task
path (:mod:`.tasks`: when the workers cannot be reached directly, or for
``--all-workers``) a chunk is one Dask task around
:func:`.worker.run.run_items`, at most ``2 × threads + 2`` in flight.  This
module holds no Dask and no path: what differs between the paths is behind
the dispatcher, and what became of each chunk comes back as one
:class:`~.dispatch.Event`.  Either way
Dask's per-task cost is paid per chunk or per lease, not per item.

Every auto-sized chunk carries a time budget: the worker stops after the item
that takes the chunk past it, and the items left over go back to the front
of the queue to be re-chunked with what is now known.  The end of a generator
is seen early because the job reads a bounded distance ahead of what it has
sent.  The mean item duration of a function (or a cell) is remembered for the
next map of the same code, which then skips the probes.

The function (or the cell) is pickled once per map and cached per worker
process; values of 1 MB or more are scattered once per worker
(``broadcast=True``) and reach the map's leases (or chunks) as Dask
dependencies.

Resilience
----------
A worker that dies mid-map (SIGKILL, memory limit) costs nothing but time:
its chunks run again elsewhere and every chunk's result is taken exactly
once.  A chunk that was running when more workers died than Dask's
``allowed-failures`` is split into single items run one at a time
("suspects", :mod:`.faults`); an item that again kills that many workers fails with
:class:`~jupyter_cluster.errors.WorkerLostError` naming it.  A scheduler that
goes away raises :class:`~jupyter_cluster.errors.ClusterError` within
seconds; a slow one is waited for (:class:`.cluster.SchedulerWatch`).  ``KeyboardInterrupt`` while waiting cancels outstanding work
(workers stop between items) and keeps the results computed so far in the
:class:`MapJob` (``job.results``), also reachable as :func:`last_job`.
"""

from __future__ import annotations

import itertools
import logging
import sys
import time
import uuid
import weakref
from bisect import insort
from collections import deque
from collections.abc import Callable, Iterator
from operator import itemgetter
from typing import Any

import cloudpickle

from ..cell.capture import LARGE_VALUE_BYTES
from ..errors import ClusterError, WorkerLostError
from ..tracking.runs import in_run
from . import planner
from .cluster import (
    Scattered,
    SchedulerWatch,
    allowed_failures,
    cached_threads,
    client_of,
    client_running,
    item_bytes,
    scheduler_lost_error,
    workers_now,
)
from .demand import adaptive
from .dispatch import Chunk, Counters, Dispatcher, Event, Note
from .faults import Faults, abbreviate  # noqa: F401  (abbreviate: re-exported by mapping)
from .options import MAX_TIMEOUT_SECONDS, _add_note, _known_length, _text_of, check_options  # noqa: F401
from .paths import MapSpec, open_dispatcher, task_dispatcher
from .paused import PausedWatch
from .planner import MAX_CHUNK_ITEMS
from .protocol import ChunkResult, ItemError, RemoteItemError

logger = logging.getLogger(__name__)

#: Observers hear about progress at most this often, in seconds.
PROGRESS_INTERVAL = 0.1
#: How long a map waits on a cluster without workers before saying so, in seconds.
NO_WORKERS_NOTICE_SECONDS = 5.0

_observer_factories: list[Callable] = []
# The most recently started map: always known weakly (a running map lives as long as whoever drives
# it; an abandoned imap must be collected, which cancels it).  Held strongly once it ended without
# finishing (an interrupt or a failure: its partial results are documented to stay reachable), or
# finished holding none of the caller's values.  A finished map that still holds them (a Pool.map's,
# a run_on_workers job's) lives only as long as its caller keeps it.
_last_job: MapJob | None = None
_last_job_ref: weakref.ReferenceType[MapJob] | None = None


def add_observer_factory(factory: Callable) -> None:
    """Register ``factory(job, progress) -> observer | None``, called for every new map.

    The observer may define ``job_started(job)``, ``job_progress(job)`` (called
    at most every :data:`PROGRESS_INTERVAL` seconds) and ``job_finished(job)``.
    ``progress`` is the user's ``progress`` argument (None = automatic).
    """
    if factory not in _observer_factories:
        _observer_factories.append(factory)


def remove_observer_factory(factory: Callable) -> None:
    """Undo :func:`add_observer_factory`."""
    if factory in _observer_factories:
        _observer_factories.remove(factory)


def last_job() -> MapJob | None:
    """The most recently started map in this process (keeps its results after an interrupt).

    A map that finished is kept for its record (counts, timings, outputs,
    failures' text) but not for its values: :func:`map` hands its results to
    its caller and keeps none, and a finished map whose caller still owns its
    results (``Pool.map``, :func:`.mapping.run_on_workers`) is returned only while that
    caller keeps the job; None after that.  So is a running map (an
    :func:`imap` its caller dropped is collected, which cancels it).
    """
    if _last_job is not None:
        return _last_job
    return _last_job_ref() if _last_job_ref is not None else None


#: Mean seconds per item of recently mapped code (a map of the same code skips the probes).
_remembered = planner.Remembered()


class MapJob:
    """One map over a cluster: a lazy iterator over results plus its live record.

    Iterate it to get results (input order, or completion order when
    ``ordered=False``); work advances while you iterate.  Created by
    :func:`imap` and :func:`map`.

    Attributes
    ----------
    id : str
        Unique id (also in the Dask task keys and the progress events).
    label : str
        What the map is called in progress displays.
    total : int or None
        Number of items, None while the input's length is unknown.
    done, failed : int
        Items finished successfully / with an error so far.
    started : float
        ``time.time()`` when the map started.
    finished : bool
        True once every item has a result, or the map failed or was cancelled.
    state : str
        ``"running"``, ``"finished"``, ``"failed"`` or ``"cancelled"``.
    results : dict
        Input index -> result for every result received so far (with
        ``retain=False``, only those not yet yielded).  After an interrupt the
        finished items' results stay here.
    outputs : dict
        Input index -> text the item printed.
    errors : dict
        Input index -> exception, for items that failed.
    tracebacks : dict
        Input index -> ``(text, frames)`` of the remote traceback (frames:
        a ``tblib`` dict, or None).
    failed_items : dict
        Input index -> ``(item, worker address)`` for failed items.
    remembered : float or None
        Mean seconds per item remembered from an earlier map of the same
        function or cell (None: not known, so the first chunks are probes).
    chunks_cut : int
        Chunks that stopped at their time budget and sent items back to be
        re-chunked.
    """

    #: the worker addresses of ``run_on_workers``, in result order (set there)
    pinned: list[str]

    def __init__(
        self,
        fn: Callable,
        iterables: tuple,
        *,
        chunksize: int | str = "auto",
        ordered: bool = True,
        retries: int = 0,
        timeout: float | None = None,
        errors: str = "raise",
        resources: dict | None = None,
        progress: Any = None,
        client: Any = None,
        label: str | None = None,
        shared: dict | None = None,
        retain: bool = True,
        capture_output: bool = True,
        on_output: Callable[[int, str, bool], None] | None = None,
        pin_workers: list[str] | None = None,
        concurrency: int | None = None,
    ):
        global _last_job, _last_job_ref
        timeout = check_options(
            errors=errors, chunksize=chunksize, retries=retries, timeout=timeout, resources=resources
        )
        if concurrency is not None and (
            isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
        ):
            raise ValueError(f"concurrency must be a positive integer or None, not {concurrency!r}.")
        if not iterables:
            raise TypeError("map() needs at least one iterable.")
        fn = in_run(
            fn
        )  # inside `with jc.run(...)`: what the workers report is the run's (jupyter_cluster.tracking.runs)
        #: Most chunks running at once (``Pool(processes=N)``); None: every worker thread.
        self.concurrency = concurrency
        self.client, self.cluster = client_of(client)
        self.id = uuid.uuid4().hex[:12]
        target = getattr(fn, "func", fn)  # functools.partial (Pool's task wrapper): name what the user wrote
        self.label = label or getattr(target, "__name__", None) or type(target).__name__
        self.fn: Callable | None = fn  # None once the map ended (_drop_inputs)
        self.chunksize = chunksize
        self.ordered = ordered
        self.retries = retries
        self.timeout = timeout
        self.errors_mode = errors
        self.resources = dict(resources) if resources else None
        self.progress = progress
        self.retain = retain
        self.on_output = on_output
        self.options = {"retries": retries, "timeout": timeout, "capture": capture_output}

        self.total = _known_length(iterables)
        self.done = 0
        self.failed = 0
        self.started = time.time()
        self.finished = False
        self.state = "running"
        self.results: dict[int, Any] = {}
        self.outputs: dict[int, str] = {}
        self.errors: dict[int, BaseException] = {}
        self.tracebacks: dict[int, tuple] = {}
        self.failed_items: dict[int, tuple] = {}  # index -> (item, worker address or None)
        self.workers_used: dict[str, int] = {}
        self.chunks_submitted = 0
        self.chunk_log: list[tuple] = []  # (first index, items, worker, start time, busy seconds)
        self.peak_in_flight = 0
        self.items_read = 0
        self.ended: float | None = None
        self._handed_over = False  # take_results() gave the values to the caller

        self._star = len(iterables) > 1
        self._source: Iterator = iter(iterables[0]) if len(iterables) == 1 else zip(*iterables)
        self._pin = list(pin_workers) if pin_workers else None
        self._buffer: deque = deque()
        self._exhausted = False
        self._next_index = 0  # index of the first buffered (unsubmitted) item
        self._inflight: dict[Any, Chunk] = {}  # dispatcher's handle -> chunk, for the chunks sent and not yet back
        self._faults = Faults(lambda: allowed_failures(self.client))
        self._resubmit: deque[Chunk] = deque()
        self._returned: deque[tuple[int, list]] = deque()  # (first index, items) a budget sent back
        self._returned_n = 0
        self._durations: list[tuple[int, list]] = []
        self._time_sum = 0.0
        self._time_n = 0
        self._duration_key = planner.duration_key(fn) if chunksize == "auto" else None
        #: Mean seconds per item remembered from an earlier map of the same code (None: not known).
        self.remembered = _remembered.get(self._duration_key) if self._duration_key is not None else None
        #: Chunks that stopped at their time budget and sent their remaining items back.
        self.chunks_cut = 0
        self._probe_items: int | None = None
        self._order: deque[int] = deque()  # completion order (unordered iteration / list)
        self._completion: list[int] = []
        self._yield_next = 0
        self._scheduler_watch = SchedulerWatch(self.client)
        self._last_progress = 0.0
        self._next_check = 0.0
        self._no_workers_since: float | None = None
        self._no_workers_warned = False
        where = f"cluster {self.cluster!r}" if isinstance(self.cluster, str) else "the cluster"
        self._paused = PausedWatch(lambda: workers_now(self.client), where, self.resources)
        #: Sends the chunks: the direct path's or the task path's, picked on the first step (.paths).
        self._dispatcher: Dispatcher | None = None
        self._round_remaining: int | None = None

        if self.resources:
            self._check_resources()
        self._token = self.id
        shared_values = dict(shared or {})
        self._blob: bytes | None = cloudpickle.dumps(fn)
        if len(self._blob) >= LARGE_VALUE_BYTES:
            shared_values["__fn__"] = fn
            self._blob = None
        self._shared = Scattered(self.client, shared_values)
        self._observers = []
        for factory in list(_observer_factories):
            try:
                obs = factory(self, progress)
            except Exception:  # a broken display must never break a map
                logger.exception("jupyter_cluster: progress observer factory failed")
                continue
            if obs is not None:
                self._observers.append(obs)
        _last_job, _last_job_ref = None, weakref.ref(self)
        self._notify("job_started")

    # -- public --------------------------------------------------------------------
    def __repr__(self) -> str:
        total = "?" if self.total is None else self.total
        return f"<MapJob {self.label!r} {self.state}: {self.done}/{total} done, {self.failed} failed, {self.elapsed:.2f} s>"

    @property
    def elapsed(self) -> float:
        """Seconds since the map started (until it ended)."""
        return (self.ended or time.time()) - self.started

    @property
    def in_flight(self) -> int:
        """Chunks submitted and not yet returned."""
        return len(self._inflight)

    @property
    def max_in_flight(self) -> int:
        """The bound on chunks in flight now (task path: ``2 × threads + 2``, one running and one queued per thread, plus slack)."""
        d = self._dispatcher
        return len(self._inflight) + d.room(len(self._inflight)) if d is not None else 0

    @property
    def path(self) -> str | None:
        """``"direct"`` (leases fed over Dask's comm) or ``"tasks"`` (one Dask task per chunk); None before the first step."""
        return self._dispatcher.name if self._dispatcher is not None else None

    @property
    def _counters(self) -> Counters | None:
        """What the dispatcher placed and sent so far (:class:`.dispatch.Counters`; None before the first step)."""
        return self._dispatcher.stats() if self._dispatcher is not None else None

    @property
    def leases(self) -> int:
        """Lease tasks this map placed (direct path; 0 on the task path)."""
        counters = self._counters
        return counters.placed if counters is not None else 0

    @property
    def relays(self) -> int:
        """Relay messages this map sent (each carried the batches of a group of workers; 0 without relays)."""
        counters = self._counters
        return counters.relayed if counters is not None else 0

    @property
    def durations(self) -> dict[int, float]:
        """Input index -> seconds the item took on its worker."""
        return self.durations_below(None)

    def durations_below(self, end: int | None) -> dict[int, float]:
        """:attr:`durations` of the items before index ``end`` only (None: all of them)."""
        out: dict[int, float] = {}
        for start, ds in self._durations:
            if end is None:
                out.update(zip(range(start, start + len(ds)), ds))
            elif start < end:
                out.update(zip(range(start, min(start + len(ds), end)), ds))
        return out

    def result_list(self) -> list:
        """All results as a list: input order, or completion order for ``ordered=False``."""
        if not self.ordered:
            return [self.results[i] for i in self._completion]
        n = self.total if self.total is not None else len(self.results)
        return list(map(self.results.__getitem__, range(n)))

    def take_results(self) -> list:
        """:meth:`result_list`, handing the values over: the job keeps none of them afterwards.

        What :func:`map` returns.  A loop of maps that return large values
        (arrays, model weights) then holds each map's values only as long as
        its caller does.  ``results`` is emptied; ``errors`` keeps, per failed
        index, a :class:`RemoteItemError` with the exception's text (the
        exceptions themselves are in the list); ``failed_items`` keeps a short
        repr of each failed item in place of the item.  Counts, timings,
        outputs and tracebacks' text stay.
        """
        out = self.result_list()
        self.results = {}
        self.errors = {i: _text_of(e) for i, e in self.errors.items()}
        self.failed_items = {i: (abbreviate(item), w) for i, (item, w) in self.failed_items.items()}
        self._handed_over = True
        self._settle_last()
        return out

    def cancel(self) -> None:
        """Stop the map: outstanding chunks are cancelled; results so far stay in ``results``."""
        if not self.finished:
            self._stop("cancelled")

    close = cancel

    def __iter__(self):
        return self

    def __next__(self):
        while True:
            if self.ordered:
                i = self._yield_next
                if i in self.results:
                    self._yield_next += 1
                    return self.results[i] if self.retain else self.results.pop(i)
                if self.total is not None and i >= self.total and self._exhausted_all():
                    if not self.finished:  # observers (progress, job events) hear that it ended
                        self._finish()
                    self._settle_last()  # everything yielded: with retain=False it holds no value now
                    raise StopIteration
            else:
                if self._order:
                    i = self._order.popleft()
                    return self.results[i] if self.retain else self.results.pop(i)
            if self.finished:
                self._settle_last()
                raise StopIteration
            self._step()

    def drain(self) -> list[tuple[int, Any]]:
        """Advance the map one step (waiting at most 0.2 s) and take the results that came back.

        For a driver that must stay responsive between results (a detached
        job's host, which also answers cancel requests).  Needs
        ``ordered=False``; returns ``(input index, result or exception)``
        pairs in completion order, removed from ``results``.
        """
        if not self.finished:
            self._step()
        out = []
        while self._order:
            i = self._order.popleft()
            out.append((i, self.results.pop(i)))
        return out

    def run(self) -> MapJob:
        """Drive the map to its end without yielding (what :func:`map` does)."""
        while not self.finished:
            self._step()
        return self

    # -- driving ---------------------------------------------------------------------
    def _exhausted_all(self) -> bool:
        return (
            self._exhausted
            and not self._buffer
            and not self._inflight
            and not self._faults.suspects
            and not self._resubmit
            and not self._returned
        )

    def _work_left(self) -> bool:
        """Whether anything is left to send (not counting what is in flight)."""
        return not (self._exhausted and not self._buffer and not self._resubmit and not self._faults.suspects)

    def _step(self) -> None:
        """Send what may be sent, then wait (at most 0.2 s) for what came back and handle it."""
        try:
            if self._dispatcher is None:
                self._choose_path()
            d = self._dispatcher
            assert d is not None
            self._handle_notes(d.prepare(self._work_left()))
            if self.finished:
                return
            self._fill()  # with the dispatcher of now: prepare() may have swapped it (the fallback)
            if self._exhausted_all():
                self._finish()
                return
            d = self._dispatcher
            assert d is not None
            self._handle_notes(d.poll(0.2))
            if self.finished:
                return
            now = time.monotonic()
            if now >= self._next_check:
                self._next_check = now + 0.5
                self._check_connection()
                self._warn_if_no_workers(now)
                self._paused.check(self.done + self.failed, not self._inflight, now)
                if self._pin is not None:
                    self._check_pinned_workers()
            self._maybe_progress()
        except KeyboardInterrupt:
            self._stop("cancelled")
            raise
        except BaseException:
            if not self.finished:
                self._stop("failed")
            raise

    # -- the dispatcher -------------------------------------------------------------------
    def _choose_path(self) -> None:
        """Leases and direct batches when the workers answer this client; plain tasks otherwise (picked once)."""
        self._dispatcher = open_dispatcher(self._spec(), pinned=self._pin is not None, empty=self.total == 0)

    def _spec(self) -> MapSpec:
        """What a dispatcher needs of this map (:mod:`.paths`)."""
        return MapSpec(
            self.client,
            self.id,
            self._token,
            self._blob,
            self._star,
            self.options,
            self._shared,
            self.resources,
            self.concurrency,
            self._check_connection,
        )

    def _fall_back(self) -> None:
        """Carry on over plain tasks (the workers cannot be reached directly from here)."""
        old, self._dispatcher = self._dispatcher, task_dispatcher(self._spec())
        for handle in list(self._inflight):
            self._requeue(self._take_back(handle))
        if old is not None:
            old.close([])

    def _fill(self) -> None:
        """Cut and send as many chunks as the dispatcher has room for (one round, sent together)."""
        d = self._dispatcher
        assert d is not None
        if not client_running(self.client):
            return  # reconnecting (a busy scheduler): nothing is sent until it is back, or the watch gives up
        room = d.room(len(self._inflight))
        if room <= 0:
            return
        fresh: list[Chunk] = []
        # Batches of one round of sends share the work left when it began (guided self-scheduling).
        self._round_remaining = self._remaining()
        try:
            self._fill_into(fresh, len(self._inflight) + room)
        finally:
            self._round_remaining = None
            if fresh:
                self._send(fresh)

    def _send(self, chunks: list[Chunk]) -> None:
        d = self._dispatcher
        assert d is not None
        try:
            handles = d.send(chunks)
        except Exception as exc:
            if client_running(self.client):
                raise
            if self._scheduler_watch.lost():  # the client let go of a scheduler that went away
                raise self._lost_scheduler() from exc
            # Reconnecting to a slow scheduler: the chunks wait for it.
            for chunk in reversed(chunks):
                self._faults.left(chunk)
                if chunk.suspect:
                    self._faults.suspects.appendleft(chunk)
                else:
                    self._resubmit.appendleft(chunk)
            return
        self.chunks_submitted += len(chunks)
        for handle, chunk in zip(handles, chunks):
            self._inflight[handle] = chunk
        if len(self._inflight) > self.peak_in_flight:
            self.peak_in_flight = len(self._inflight)

    def _fill_into(self, fresh: list, limit: int) -> None:
        # New chunks collect in ``fresh`` and go out together (one graph update, or one round of batches).
        while len(self._inflight) + len(fresh) < limit:
            if self._resubmit:
                fresh.append(self._resubmit.popleft())
                continue
            suspect = self._faults.next_suspect()
            if suspect is not None:
                fresh.append(suspect)
                continue
            if self._pin is not None:
                if self._next_index >= len(self._pin):
                    self._exhausted = True
                    return
                i = self._next_index
                self._next_index += 1
                self.items_read += 1
                fresh.append(Chunk(i, [self._pin[i]], pin=self._pin[i]))
                continue
            size, budget = self._next_size()
            if self._returned:
                start, items = self._take_returned(size)
            else:
                items = self._take(size)
                start = self._next_index - len(items)
            if not items:
                return
            fresh.append(Chunk(start, items, budget=budget))

    def _take_returned(self, size: int) -> tuple[int, list]:
        start, items = self._returned.popleft()
        if len(items) > size:
            self._returned.appendleft((start + size, items[size:]))
            items = items[:size]
        self._returned_n -= len(items)
        return start, items

    def _remaining(self) -> int | None:
        if self.total is not None:
            return self.total - self._next_index + self._returned_n
        if self._exhausted:
            return len(self._buffer) + self._returned_n
        return None

    def _per_item(self) -> float | None:
        """Mean seconds per item: measured in this map, else remembered from an earlier one."""
        if self._time_n:
            return max(self._time_sum / self._time_n, 1e-7)
        if self.remembered is not None:
            return max(self.remembered, 1e-7)
        return None

    def _next_size(self) -> tuple[int, float | None]:
        """Items and time budget of the next chunk (:func:`.engine.planner.next_size`, spread as the dispatcher says)."""
        if isinstance(self.chunksize, int):  # check_options: a positive int, or "auto"
            return self.chunksize, None
        assert self._dispatcher is not None
        per_item = self._per_item()
        spread = self._dispatcher.sizing(self._remaining(), self._round_remaining, per_item, not self._inflight)
        probe = self._probe_size() if per_item is None else 1
        return planner.next_size(per_item=per_item, probe=probe, **spread)

    def _probe_size(self) -> int:
        """Items of the next probe: the probes of a map share one probe's items, each half of what is left."""
        if self._probe_items is None:
            if not self._buffer and not self._exhausted:
                self._take_ahead(1)
            first = self._returned[0][1][0] if self._returned else (self._buffer[0] if self._buffer else None)
            self._probe_items = planner.probe_items(item_bytes(first) if first is not None else 1)
        share = max(1, (self._probe_items + 1) // 2)
        self._probe_items = max(self._probe_items - share, 1)
        return share

    def _take_ahead(self, want: int) -> None:
        buf = self._buffer
        if not self._exhausted and len(buf) < want:
            # islice reads in C; next() per item cost ~1 µs per item on 10^5 no-ops.
            need = want - len(buf)
            before = len(buf)
            buf.extend(itertools.islice(self._source, need))
            if len(buf) - before < need:
                self._exhausted = True
                if self.total is None:
                    self.total = self._next_index + len(buf)

    def _take(self, size: int) -> list:
        # Read ahead of what is submitted, so the end of a generator is seen
        # while there is still time to shrink chunks for a balanced tail.
        # The distance is capped, so memory stays bounded by about
        # (chunks in flight + 1) × MAX_CHUNK_ITEMS items.
        # Not before any item's duration is known: the probes alone read at most one probe's items.
        threads = self._dispatcher.threads() if self._dispatcher is not None else 1
        ahead = min(size * 2 * threads, MAX_CHUNK_ITEMS) if self.chunksize == "auto" and self._per_item() else 0
        self._take_ahead(size + ahead)
        buf = self._buffer
        n = min(size, len(buf))
        if n == len(buf):
            items = list(buf)
            buf.clear()
        else:  # in C: a popleft() per item cost 0.4 µs per item on 10^6 no-ops
            items = list(itertools.islice(buf, n))
            rest = list(itertools.islice(buf, n, None))
            buf.clear()
            buf.extend(rest)
        self._next_index += n
        self.items_read = self._next_index + len(buf)
        return items

    # -- what came back ----------------------------------------------------------------------
    def _handle_notes(self, notes: list[Note]) -> None:
        for note in notes:
            self._handle_note(note)
            if self.finished:
                return

    def _handle_note(self, note: Note) -> None:
        if note.event is Event.FALLBACK:
            self._fall_back()
            return
        if note.handle not in self._inflight:  # written off already, or the map stopped
            return
        chunk = self._take_back(note.handle)
        match note.event:
            case Event.DONE:
                self._record(chunk, note.data)
            case Event.RETRY:
                self._requeue(chunk)
            case Event.DIED:
                self._chunk_died(chunk)
            case Event.KILLED:
                self._fail_item(chunk, self._faults.killed(chunk, note.data))
            case Event.FAILED:
                self._chunk_failed(chunk, note.data)
            case Event.CANCELLED:  # by the cluster, without us asking
                if self._scheduler_watch.lost():
                    raise self._lost_scheduler()
                chunk.resubmits += 1
                if chunk.resubmits > 3:
                    raise ClusterError(
                        f"the cluster cancelled the chunk with items {chunk.start}..{chunk.start + len(chunk.items) - 1} {chunk.resubmits} times; check the workers' logs."
                    )
                self._resubmit.append(chunk)

    def _take_back(self, handle: Any) -> Chunk:
        chunk = self._inflight.pop(handle)
        self._faults.left(chunk)
        return chunk

    def _requeue(self, chunk: Chunk) -> None:
        if chunk.suspect:
            self._faults.suspects.appendleft(chunk)
        else:
            self._resubmit.append(chunk)

    def _chunk_died(self, chunk: Chunk) -> None:
        """A worker process died while running ``chunk``: run it again, split it, or give up on its item (:mod:`.faults`)."""
        verdict = self._faults.died(chunk)
        if isinstance(verdict, Chunk):
            self._requeue(verdict)
        else:
            self._fail_item(chunk, verdict)

    def _fail_item(self, chunk: Chunk, err: BaseException | None) -> None:
        """Fail a suspect chunk's one item with ``err`` (None: nothing to fail, the chunk was split)."""
        if err is None:
            return
        self.failed_items[chunk.start] = (chunk.items[0], None)
        self._record_failure(chunk.start, err)

    def _chunk_failed(self, chunk: Chunk, exc: BaseException) -> None:
        """A failure of the batch or task itself (not of an item): items or results that could not be (de)serialised, and the like."""
        last = chunk.start + len(chunk.items) - 1
        span = f"item {chunk.start}" if last == chunk.start else f"items {chunk.start}..{last}"
        unit = self._dispatcher.unit if self._dispatcher is not None else "batch"
        _add_note(exc, f"jupyter_cluster: the {unit} running {span} failed as a whole.")
        for k in range(len(chunk.items)):
            self._record_failure(chunk.start + k, exc)

    # -- the cluster ---------------------------------------------------------------------------
    def _warn_if_no_workers(self, now: float) -> None:
        """Say once why nothing happens when the cluster has no workers.

        Waiting is right (an adaptive cluster will add workers, a scaled one
        is starting them), so this informs rather than fails.
        """
        if self._no_workers_warned:
            return
        # The client refreshes this every 2 s by itself; asking the scheduler
        # here once a second cost a round trip that grows with the cluster.
        threads = cached_threads(self.client)
        if threads is None:
            return
        has_workers = threads > 0
        if has_workers:
            self._no_workers_since = None
            return
        if self._no_workers_since is None:
            self._no_workers_since = now
        elif now - self._no_workers_since > NO_WORKERS_NOTICE_SECONDS:
            self._no_workers_warned = True
            where = f"cluster {self.cluster!r}" if isinstance(self.cluster, str) else "the cluster"
            if adaptive(self.client):  # the map asked it for workers (engine/demand.py): they may be queued
                print(
                    f"jupyter_cluster: {where} has no workers yet; the map waits while its adaptive scaling adds "
                    "some (a batch system may keep them queued), or interrupt to stop.",
                    file=sys.stderr,
                )
                return
            print(
                f"jupyter_cluster: {where} has no workers, so the map is waiting; add some with %cluster scale N "
                "(or jupyter_cluster.current().scale(N)), or interrupt to stop.",
                file=sys.stderr,
            )

    def _check_connection(self) -> None:
        if self._scheduler_watch.lost():
            raise self._lost_scheduler()

    def _lost_scheduler(self) -> ClusterError:
        total = self.total if self.total is not None else "?"
        return scheduler_lost_error(
            self.client,
            f"{self.done} of {total} items were done, their results are in jupyter_cluster.last_job().results",
            "run the map again",
            cluster=self.cluster,
        )

    def _check_pinned_workers(self) -> None:
        try:
            alive = set(workers_now(self.client))
        except Exception:
            return
        d = self._dispatcher
        for handle, chunk in list(self._inflight.items()):
            if chunk.pin not in alive:
                self._inflight.pop(handle)
                if d is not None:
                    d.cancel(handle)
                err = WorkerLostError(f"worker {chunk.pin} left the cluster before the cell ran there.")
                self._record_failure(chunk.start, err)

    def _record(self, chunk: Chunk, result: tuple) -> None:
        r = ChunkResult._make(result)  # a plain tuple on the wire (see .protocol)
        values, durations, outputs, errors, worker = r.values, r.durations, r.outputs, r.errors, r.worker
        n = len(values)
        busy = sum(durations)
        self.chunk_log.append((chunk.start, n, worker, r.started, busy))
        start = chunk.start
        if n < len(chunk.items):  # the budget ran out (or the task was stopped): run the rest again
            if chunk.suspect or chunk.pin is not None or chunk.budget is None:
                self._resubmit.append(Chunk(start + n, chunk.items[n:], suspect=chunk.suspect, pin=chunk.pin))
            else:  # back to the queue in input order (before what was never sent), chunked anew with what is now known
                self.chunks_cut += 1
                insort(self._returned, (start + n, chunk.items[n:]), key=itemgetter(0))
                self._returned_n += len(chunk.items) - n
        if worker:
            self.workers_used[worker] = self.workers_used.get(worker, 0) + n
        self._durations.append((start, durations))
        self._time_sum += busy
        self._time_n += n
        idx = range(start, start + n)
        self.results.update(zip(idx, values))
        self._completion.extend(idx)
        if not self.ordered:
            self._order.extend(idx)
        if outputs:
            for pos, text in outputs.items():
                self.outputs[start + pos] = text
        n_failed = len(errors) if errors else 0
        self.done += n - n_failed
        if outputs and self.on_output is not None:
            for pos in sorted(outputs):
                if not errors or pos not in errors:
                    self._call_output(start + pos, outputs[pos], False)
        if errors:
            for pos in sorted(errors):
                self._item_failed(start + pos, chunk.items[pos], errors[pos], worker, outputs)
                if self.finished:
                    return

    def _call_output(self, index: int, text: str, failed: bool) -> None:
        callback = self.on_output
        if callback is None:
            return
        try:
            callback(index, text, failed)
        except Exception:
            logger.exception("jupyter_cluster: output callback failed")

    def _item_failed(self, index: int, item: Any, info: tuple, worker: str | None, outputs: dict | None) -> None:
        error = ItemError._make(info)
        exc, text = error.exc, error.text
        if exc is None:
            exc = RemoteItemError(f"{error.type_name}: {error.message}")
        where = f" on worker {worker}" if worker else ""
        _add_note(
            exc,
            f"jupyter_cluster: item {index} ({abbreviate(item)}) failed{where}.\nRemote traceback:\n{text.rstrip()}",
        )
        self.tracebacks[index] = (text, error.frames)
        self.failed_items[index] = (item, worker)
        self._record_failure(index, exc, in_results=True)

    def _record_failure(self, index: int, exc: BaseException, in_results: bool = False) -> None:
        """Count a failed item; with errors="raise" stop the map and raise ``exc``."""
        self.results[index] = exc
        if not in_results:
            self._completion.append(index)
            if not self.ordered:
                self._order.append(index)
        self.failed += 1
        self.errors[index] = exc
        if self.on_output is not None:
            self._call_output(index, self.outputs.get(index, ""), True)
        if self.errors_mode == "raise":
            self._stop("failed")
            raise exc

    def _check_resources(self) -> None:
        workers = workers_now(self.client)
        need = self.resources or {}
        if not any(all(w.get("resources", {}).get(k, 0) >= v for k, v in need.items()) for w in workers.values()):
            wanted = ",".join(f"{k}={v}" for k, v in need.items())
            raise ClusterError(
                f"no worker of this cluster has the resources {wanted}; start workers that have them "
                f"(e.g. `dask worker ADDRESS --resources {wanted}`) or drop --resources."
            )

    # -- ending ------------------------------------------------------------------------------
    def _cancel_outstanding(self) -> None:
        pending = list(self._inflight)
        self._inflight.clear()
        if self._dispatcher is not None:
            self._dispatcher.close(pending)
        self._faults.clear()
        self._resubmit.clear()
        self._returned.clear()
        self._returned_n = 0
        self._shared.release()

    def _stop(self, state: str) -> None:
        if self.finished:
            return
        self._cancel_outstanding()
        self._end(state)

    def _finish(self) -> None:
        if self._dispatcher is not None:
            self._dispatcher.close([], keep=True)
        self._shared.release()
        if self._time_n:
            _remembered.put(self._duration_key, self._time_sum / self._time_n)
        if self.total is None:
            self.total = self._next_index
        self._end("finished")

    def _end(self, state: str) -> None:
        self.finished = True
        self.state = state
        self.ended = time.time()
        self._drop_inputs()
        self._notify("job_progress")
        self._notify("job_finished")
        self._settle_last()

    def _drop_inputs(self) -> None:
        """Let go of the caller's inputs: nothing reads them once the map has ended.

        The input iterator (and the list or generator behind it), items read
        ahead or sent back, the function and the large values.  Failed items
        stay in ``failed_items`` (error messages name them).
        """
        self._source = iter(())
        self._buffer.clear()
        self._returned.clear()
        self._returned_n = 0
        self._faults.clear()
        self._resubmit.clear()
        self._shared.release()
        self._blob = None
        self.fn = None
        if self._dispatcher is not None:
            self._dispatcher.forget_function()

    def _holds_values(self) -> bool:
        return not self._handed_over and bool(self.results or self.errors or self.failed_items)

    def _settle_last(self) -> None:
        """Hold this job strongly as :func:`last_job` only where it should outlive its caller (see there)."""
        global _last_job
        if _last_job_ref is None or _last_job_ref() is not self:
            return  # a newer map started since: it is the one last_job() returns
        keep = self.finished and (self.state != "finished" or not self._holds_values())
        _last_job = self if keep else None

    def _maybe_progress(self) -> None:
        now = time.monotonic()
        if now - self._last_progress >= PROGRESS_INTERVAL:
            self._last_progress = now
            self._notify("job_progress")

    def _notify(self, method: str) -> None:
        for obs in self._observers:
            fn = getattr(obs, method, None)
            if fn is None:
                continue
            try:
                fn(self)
            except Exception:
                logger.exception("jupyter_cluster: progress observer %s failed", method)

    def __del__(self):
        # An abandoned lazy iterator must not leave work running on the cluster.
        try:
            if not self.finished and (self._inflight or self._dispatcher is not None):
                self._cancel_outstanding()
        except Exception:
            pass
