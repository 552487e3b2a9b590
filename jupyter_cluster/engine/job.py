"""One map's dispatch loop (:class:`MapJob`), on either path.

The map's parts: its record (:mod:`.record`: what the magic, ``Pool`` and
the observers read), its input window (:mod:`.window`), its observers and
:func:`last_job` (:mod:`.observers`), and the cluster as one
:class:`.port.ClusterPort` (dispatchers, scattered values, the scheduler
watch, the worker list), which a unit test fakes.

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
:class:`~.dispatch.MapEvent` (one class per outcome).  Either way
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
seconds; a slow one is waited for (:class:`.scheduler_watch.SchedulerWatch`).  ``KeyboardInterrupt`` while waiting cancels outstanding work
(workers stop between items) and keeps the results computed so far in the
:class:`MapJob` (``job.results``), also reachable as :func:`last_job`.
"""

from __future__ import annotations

import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

import cloudpickle

from ..cell.capture import LARGE_VALUE_BYTES
from ..errors import ClusterError, WorkerLostError
from ..tracking.context import in_run
from ..tracking.tags import ItemTap
from . import observers, planner
from .dispatch import Cancelled, Chunk, ChunkEvent, Died, Dispatcher, Done, Failed, Fallback, Killed, MapEvent, Retry
from .faults import Faults, abbreviate  # noqa: F401  (abbreviate: re-exported by mapping)
from .observers import (  # noqa: F401  (re-exported: mapping's names, and the front ends' factories)
    PROGRESS_INTERVAL,
    _observer_factories,
    add_observer_factory,
    last_job,
    remove_observer_factory,
)
from .options import MAX_TIMEOUT_SECONDS, _add_note, _known_length, _text_of, check_options, check_resources  # noqa: F401
from .paths import MapSpec
from .paused import NO_WORKERS_NOTICE_SECONDS, NoWorkersNotice, PausedWatch  # noqa: F401
from .planner import MAX_CHUNK_ITEMS
from .port import ClusterPort, LivePort
from .protocol import ChunkResult, MapRun, RemoteItemError  # noqa: F401  (RemoteItemError: re-exported by mapping)
from .record import JobRecord
from .threads_watch import ThreadsWatch
from .window import InputWindow

#: Stands for "no result yet" in the per-item lookup (None may be a result).
_MISSING = object()

#: Mean seconds per item of recently mapped code (a map of the same code skips the probes).
_remembered = planner.Remembered()


class MapJob(JobRecord):
    """One map over a cluster: a lazy iterator over results plus its live record (:class:`.record.JobRecord`).

    Iterate it to get results (input order, or completion order when
    ``ordered=False``); work advances while you iterate.  Created by
    :func:`imap` and :func:`map`.  ``port`` (a :class:`.port.ClusterPort`)
    is the cluster as the map sees it; by default the one made from
    ``client`` (:class:`.port.LivePort`).
    """

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
        port: ClusterPort | None = None,
        tap: ItemTap | None = None,
        origin: dict | None = None,
    ):
        timeout = check_options(
            errors=errors,
            chunksize=chunksize,
            retries=retries,
            timeout=timeout,
            resources=resources,
            concurrency=concurrency,
        )
        if not iterables:
            raise TypeError("map() needs at least one iterable.")
        fn = in_run(
            fn
        )  # inside `with jc.run(...)`: what the workers report is the run's (jupyter_cluster.tracking.runs)
        super().__init__(ordered=ordered, retain=retain, errors=errors, on_output=on_output)
        #: Most chunks running at once (``Pool(processes=N)``); None: every worker thread.
        self.concurrency = concurrency
        self._port: ClusterPort = port if port is not None else LivePort(client)
        self.client, self.cluster = self._port.client, self._port.cluster
        self.id = uuid.uuid4().hex[:12]
        target = getattr(fn, "func", fn)  # functools.partial (Pool's task wrapper): name what the user wrote
        self.label = label or getattr(target, "__name__", None) or type(target).__name__
        self.fn: Callable | None = fn  # None once the map ended (_drop_inputs)
        self.chunksize = chunksize
        self.retries = retries
        self.timeout = timeout
        self.resources = dict(resources) if resources else None
        self.progress = progress

        star = len(iterables) > 1
        source = iter(iterables[0]) if len(iterables) == 1 else zip(*iterables)
        # One list: chunks are sliced from it (type(), not isinstance: a subclass may change slicing)
        sequence = iterables[0] if len(iterables) == 1 and type(iterables[0]) is list and not pin_workers else None
        pin = list(pin_workers) if pin_workers else None
        self._window = InputWindow(source, _known_length(iterables), pin, sequence)
        self._inflight: dict[Any, Chunk] = {}  # dispatcher's handle -> chunk, for the chunks sent and not yet back
        self._faults = Faults(self._port.allowed_failures)
        self._resubmit: deque[Chunk] = deque()
        self._duration_key = planner.duration_key(fn) if chunksize == "auto" else None
        #: Mean seconds per item remembered from an earlier map of the same code (None: not known).
        self.remembered = _remembered.get(self._duration_key) if self._duration_key is not None else None
        self._yield_next = 0
        self._next_check = 0.0
        where = f"cluster {self.cluster!r}" if isinstance(self.cluster, str) else "the cluster"
        self._paused = PausedWatch(self._port.workers, where, self.resources)
        self._threads_watch = ThreadsWatch(self._port.workers)
        self._no_workers = NoWorkersNotice(self._port.threads, self._port.adaptive, where)
        #: Sends the chunks: the direct path's or the task path's, picked on the first step (.paths).
        self._dispatcher: Dispatcher | None = None
        self._round_remaining: int | None = None

        if self.resources:
            check_resources(self._port.workers(), self.resources)
        shared_values = dict(shared or {})
        pickled = cloudpickle.dumps(fn)
        blob: bytes | None = pickled
        if len(pickled) >= LARGE_VALUE_BYTES:
            shared_values["__fn__"] = fn  # travels as a large value, sent once per worker
            blob = None
        self._shared = self._port.scatter(shared_values)
        #: What the workers need of this map, built once and sent whole (:class:`.protocol.MapRun`);
        #: its ``token``, the map's id, names the function in the workers' cache.
        self.map_run = MapRun(self.id, blob, star, retries, timeout, capture_output)
        #: What either path needs of this map (:mod:`.paths`), made once on the first step (it refers back to
        #: the map: made earlier, an imap dropped before its first step would wait for the garbage collector).
        self._spec: MapSpec | None = None
        #: A ``%%parallel`` sweep's items and run (:class:`~jupyter_cluster.tracking.tags.ItemTap`), and where a
        #: map came from when not from this process (a detached job's kernel): what its observers record.
        self.tap = tap
        self.origin = origin
        self._observers = observers.Observers(self, progress)
        observers.started(self)
        self._observers.notify("job_started")

    # -- public --------------------------------------------------------------------
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
                # Per item, so one dict lookup: the record's dict itself, the chunks come filed in it when due.
                take = self._results.get if self.retain else self._results.pop
                value = take(i, _MISSING)
                if value is _MISSING and self._pending:
                    self._file_pending()
                    value = take(i, _MISSING)
                if value is not _MISSING:
                    self._yield_next += 1
                    return value
                if self.total is not None and i >= self.total and self._exhausted_all():
                    if not self.finished:  # observers (progress, job events) hear that it ended
                        self._finish()
                    self._settle_last()  # everything yielded: with retain=False it holds no value now
                    raise StopIteration
            else:
                if self._order:
                    i = self._order.popleft()
                    results = self.results
                    return results[i] if self.retain else results.pop(i)
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
        results = self.results
        while self._order:
            i = self._order.popleft()
            out.append((i, results.pop(i)))
        return out

    def run(self) -> MapJob:
        """Drive the map to its end without yielding (what :func:`map` does)."""
        while not self.finished:
            self._step()
        return self

    # -- driving ---------------------------------------------------------------------
    def _exhausted_all(self) -> bool:
        return (
            self._window.sent_all()
            and not self._inflight
            and not self._faults.suspects
            and not self._resubmit
            and not self._window.returned
        )

    def _work_left(self) -> bool:
        """Whether anything is left to send (not counting what is in flight)."""
        return not (self._window.sent_all() and not self._resubmit and not self._faults.suspects)

    def _step(self) -> None:
        """Send what may be sent, then wait (at most 0.2 s) for what came back and handle it."""
        try:
            if self._dispatcher is None:  # leases when the workers answer this client, plain tasks otherwise
                pinned, empty = self._window.pin is not None, self.total == 0
                self._dispatcher = self._port.dispatcher(self._map_spec(), pinned=pinned, empty=empty)
            d = self._dispatcher
            self._handle_events(d.prepare(self._work_left()))
            if self.finished:
                return
            self._fill()  # with the dispatcher of now: prepare() may have swapped it (the fallback)
            if self._exhausted_all():
                self._finish()
                return
            d = self._dispatcher
            self._handle_events(d.poll(0.2))
            if self.finished:
                return
            now = time.monotonic()
            if now >= self._next_check:
                self._next_check = now + 0.5
                self._check_connection()
                self._no_workers.check(now)
                self._paused.check(self.done + self.failed, not self._inflight, now)
                # On the task path the map's own queued tasks wait for threads: that is its way.
                held = bool(self._inflight) and self._dispatcher.holds_threads
                self._threads_watch.check(self.done + self.failed, held, now)
                if self._window.pin is not None:
                    self._check_pinned_workers()
            self._observers.maybe_progress()
        except KeyboardInterrupt:
            self._stop("cancelled")
            raise
        except BaseException:
            if not self.finished:
                self._stop("failed")
            raise

    # -- sending -------------------------------------------------------------------------
    def _map_spec(self) -> MapSpec:
        if self._spec is None:
            self._spec = MapSpec(
                self.client,
                self.id,
                self.map_run,
                self._shared,
                self.resources,
                self.concurrency,
                self._check_connection,
            )
        return self._spec

    def _fall_back(self) -> None:
        """Carry on over plain tasks (the workers cannot be reached directly from here)."""
        old, self._dispatcher = self._dispatcher, self._port.fallback(self._map_spec())
        for handle in list(self._inflight):
            self._requeue(self._take_back(handle))
        if old is not None:
            old.close([])

    def _fill(self) -> None:
        """Cut and send as many chunks as the dispatcher has room for (one round, sent together)."""
        d = self._dispatcher
        assert d is not None
        if not self._port.running():
            return  # reconnecting (a busy scheduler): nothing is sent until it is back, or the watch gives up
        room = d.room(len(self._inflight))
        if room <= 0:
            return
        fresh: list[Chunk] = []
        # Batches of one round of sends share the work left when it began (guided self-scheduling).
        self._round_remaining = self._window.remaining()
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
            if self._port.running():
                raise
            if self._port.lost():  # the client let go of a scheduler that went away
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
        window = self._window
        while len(self._inflight) + len(fresh) < limit:
            if self._resubmit:
                fresh.append(self._resubmit.popleft())
                continue
            chunk = self._faults.next_suspect()
            if chunk is None:
                if window.pin is not None:
                    chunk = window.next_pinned()
                else:
                    size, budget = self._next_size()
                    chunk = window.next_chunk(size, budget, self._read_ahead(size))
                if chunk is None:
                    return
            fresh.append(chunk)

    def _next_size(self) -> tuple[int, float | None]:
        """Items and time budget of the next chunk (:func:`.engine.planner.next_size`, spread as the dispatcher says)."""
        if isinstance(self.chunksize, int):  # check_options: a positive int, or "auto"
            return self.chunksize, None
        assert self._dispatcher is not None
        per_item = self._per_item()
        spread = self._dispatcher.sizing(self._window.remaining(), self._round_remaining, per_item, not self._inflight)
        probe = self._window.probe_size() if per_item is None else 1
        return planner.next_size(per_item=per_item, probe=probe, **spread)

    def _read_ahead(self, size: int) -> int:
        """Items to read beyond a new chunk's, so the end of a generator is seen while the tail can still be balanced.

        Not before any item's duration is known: the probes alone read at most one probe's items.
        """
        if self.chunksize != "auto" or not self._per_item():
            return 0
        threads = self._dispatcher.threads() if self._dispatcher is not None else 1
        return min(size * 2 * threads, MAX_CHUNK_ITEMS)

    # -- what came back ----------------------------------------------------------------------
    def _handle_events(self, events: list[MapEvent]) -> None:
        for event in events:
            self._handle_event(event)
            if self.finished:
                return

    def _handle_event(self, event: MapEvent) -> None:
        """The one place a dispatcher's report changes the map: a dispatch on the event's class."""
        if isinstance(event, Fallback):
            self._fall_back()
            return
        assert isinstance(event, ChunkEvent), event
        if event.handle not in self._inflight:  # written off already, or the map stopped
            return
        chunk = self._take_back(event.handle)
        match event:
            case Done(result=result):
                self._record(chunk, result)
            case Retry():
                self._requeue(chunk)
            case Died():
                self._chunk_died(chunk)
            case Killed(error=error):
                self._fail_item(chunk, self._faults.killed(chunk, error))
            case Failed(error=error):
                self._chunk_failed(chunk, error)
            case Cancelled():  # by the cluster, without us asking
                if self._port.lost():
                    raise self._lost_scheduler()
                chunk.resubmits += 1
                if chunk.resubmits > 3:
                    raise ClusterError(
                        f"the cluster cancelled the chunk with items {chunk.start}..{chunk.start + len(chunk.items) - 1} {chunk.resubmits} times; check the workers' logs."
                    )
                self._resubmit.append(chunk)
            case _:
                raise TypeError(f"unknown map event {event!r}")

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

    def _record(self, chunk: Chunk, r: ChunkResult) -> None:
        start, n = chunk.start, len(r.values)
        if n < len(chunk.items):  # the budget ran out (or the task was stopped): run the rest again
            if chunk.suspect or chunk.pin is not None or chunk.budget is None:
                self._resubmit.append(Chunk(start + n, chunk.items[n:], suspect=chunk.suspect, pin=chunk.pin))
            else:  # back to the queue in input order (before what was never sent), chunked anew with what is now known
                self.chunks_cut += 1
                self._window.give_back(start + n, chunk.items[n:])
        self._store(start, r)
        if r.errors:
            for pos in sorted(r.errors):
                exc = self._item_error(start + pos, chunk.items[pos], r.errors[pos], r.worker)
                self._record_failure(start + pos, exc, in_results=True)
                if self.finished:
                    return

    def _record_failure(self, index: int, exc: BaseException, in_results: bool = False) -> None:
        """Count a failed item; with errors="raise" stop the map and raise ``exc``."""
        self._count_failure(index, exc, in_results)
        if self.errors_mode == "raise":
            self._stop("failed")
            raise exc

    # -- the cluster ---------------------------------------------------------------------------
    def _check_connection(self) -> None:
        if self._port.lost():
            raise self._lost_scheduler()

    def _lost_scheduler(self) -> ClusterError:
        total = self.total if self.total is not None else "?"
        return self._port.lost_error(
            f"{self.done} of {total} items were done, their results are in jupyter_cluster.last_job().results",
            "run the map again",
        )

    def _check_pinned_workers(self) -> None:
        try:
            alive = set(self._port.workers())
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

    # -- ending ------------------------------------------------------------------------------
    def _cancel_outstanding(self) -> None:
        pending = list(self._inflight)
        self._inflight.clear()
        if self._dispatcher is not None:
            self._dispatcher.close(pending)
        self._faults.clear()
        self._resubmit.clear()
        self._window.drop_returned()
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
            self.total = self._window.next_index
        self._end("finished")

    def _end(self, state: str) -> None:
        self.finished = True
        self.state = state
        self.ended = time.time()
        self._drop_inputs()
        self._observers.notify("job_progress")
        self._observers.notify("job_finished")
        self._settle_last()

    def _drop_inputs(self) -> None:
        """Let go of the caller's inputs: nothing reads them once the map has ended.

        The input iterator (and the list or generator behind it), items read
        ahead or sent back, the function and the large values.  Failed items
        stay in ``failed_items`` (error messages name them).
        """
        self._window.drop()
        self._faults.clear()
        self._resubmit.clear()
        self._shared.release()
        self.map_run = self.map_run.without_function()
        self._spec = None
        self.fn = None
        if self._dispatcher is not None:
            self._dispatcher.forget_function()

    def __del__(self):
        # An abandoned lazy iterator must not leave work running on the cluster.
        try:
            if not self.finished and (self._inflight or self._dispatcher is not None):
                self._cancel_outstanding()
        except Exception:
            pass
