"""A map's live record: what the magic, ``Pool`` and the observers read of a :class:`.job.MapJob`.

:class:`JobRecord` holds the counts, the results by input index, the
outputs, errors and remote tracebacks, the timings and the chunk log, and
reads how many chunks are in flight and what the dispatcher placed, and
turns what came back of a chunk (a :class:`.protocol.ChunkResult`, an item's
:class:`.protocol.ItemError`) into them.  It sends nothing and waits on
nothing: the loop that does is :class:`.job.MapJob`, its subclass.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from operator import itemgetter
from typing import Any

from . import observers
from .dispatch import Chunk, Counters, Dispatcher
from .faults import abbreviate
from .options import _add_note, _text_of
from .protocol import ChunkResult, ItemError, RemoteItemError
from .window import InputWindow

logger = logging.getLogger("jupyter_cluster.engine.job")
_first = itemgetter(0)


class JobRecord:
    """One map's record, updated as its chunks come back.

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

    id: str
    label: str
    remembered: float | None
    #: the worker addresses of ``run_on_workers``, in result order (set there)
    pinned: list[str]
    # What the loop (:class:`.job.MapJob`) sends and reads through: the counts below read them.
    _window: InputWindow
    _inflight: dict[Any, Chunk]
    _dispatcher: Dispatcher | None

    def __init__(self, *, ordered: bool, retain: bool, errors: str, on_output: Callable[[int, str, bool], None] | None):
        self.ordered = ordered
        self.retain = retain
        self.errors_mode = errors
        self.on_output = on_output
        self.done = 0
        self.failed = 0
        self.started = time.time()
        self.finished = False
        self.state = "running"
        self._results: dict[int, Any] = {}
        self.outputs: dict[int, str] = {}
        self.errors: dict[int, BaseException] = {}
        self.tracebacks: dict[int, tuple] = {}
        self.failed_items: dict[int, tuple] = {}  # index -> (item, worker address or None)
        self.workers_used: dict[str, int] = {}
        self.chunks_submitted = 0
        self.chunk_log: list[tuple] = []  # (first index, items, worker, start time, busy seconds)
        self.peak_in_flight = 0
        self.ended: float | None = None
        #: Chunks that stopped at their time budget and sent their remaining items back.
        self.chunks_cut = 0
        self._handed_over = False  # take_results() gave the values to the caller
        # Chunks' values not yet filed by index in ``results`` (start, values): filed when ``results`` is
        # read; result_list() joins them as they are (a map of 10^6 quick items built a 10^6-key dict).
        self._pending: list[tuple[int, list]] = []
        self._durations: list[tuple[int, list[tuple[int, float]]]] = []  # (start, the chunk's timing runs)
        self._time_sum = 0.0
        self._time_n = 0
        self._order: deque[int] = deque()  # completion order (unordered iteration / list)
        self._completion: list[int] = []

    # -- read ------------------------------------------------------------------------------
    @property
    def results(self) -> dict[int, Any]:
        """Input index -> result (or exception) of every item back so far (see the class's text)."""
        if self._pending:
            self._file_pending()
        return self._results

    @results.setter
    def results(self, value: dict[int, Any]) -> None:
        self._pending = []
        self._results = value

    def _file_pending(self) -> None:
        pending, self._pending = self._pending, []
        results = self._results
        for start, values in pending:
            results.update(zip(range(start, start + len(values)), values))

    @property
    def total(self) -> int | None:
        """Number of items, None while the input's length is unknown."""
        return self._window.total

    @total.setter
    def total(self, value: int | None) -> None:
        self._window.total = value

    @property
    def items_read(self) -> int:
        """Items read from the input so far."""
        return self._window.items_read

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

    def __repr__(self) -> str:
        total = "?" if self.total is None else self.total
        return f"<MapJob {self.label!r} {self.state}: {self.done}/{total} done, {self.failed} failed, {self.elapsed:.2f} s>"

    @property
    def elapsed(self) -> float:
        """Seconds since the map started (until it ended)."""
        return (self.ended or time.time()) - self.started

    @property
    def durations(self) -> dict[int, float]:
        """Input index -> seconds the item took on its worker."""
        return self.durations_below(None)

    def durations_below(self, end: int | None) -> dict[int, float]:
        """:attr:`durations` of the items before index ``end`` only (None: all of them)."""
        out: dict[int, float] = {}
        for start, timings in self._durations:
            index = start
            for n, each in timings:
                if end is not None and index >= end:
                    break
                stop = index + n if end is None else min(index + n, end)
                out.update(dict.fromkeys(range(index, stop), each))
                index += n
        return out

    def result_list(self) -> list:
        """All results as a list: input order, or completion order for ``ordered=False``."""
        if not self.ordered:
            results = self.results
            return [results[i] for i in self._completion]
        n = self.total if self.total is not None else len(self.results)
        joined = self._joined(n) if self._pending else None
        return joined if joined is not None else list(map(self.results.__getitem__, range(n)))

    def _joined(self, n: int) -> list | None:
        """The first ``n`` results joined chunk by chunk, those filed by index filling the gaps; None if that cannot be done."""
        filed = self._results
        out: list = []
        pos = 0
        for start, values in sorted(self._pending, key=_first):
            if start < pos:
                return None  # overlapping chunks: not ours to sort out here
            if start > pos:
                if any(i not in filed for i in range(pos, start)):
                    return None
                out.extend(map(filed.__getitem__, range(pos, start)))
            out += values
            pos = start + len(values)
        if pos > n or any(i not in filed for i in range(pos, n)):
            return None
        out.extend(map(filed.__getitem__, range(pos, n)))
        return out

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

    def _per_item(self) -> float | None:
        """Mean seconds per item: measured in this map, else remembered from an earlier one."""
        if self._time_n:
            return max(self._time_sum / self._time_n, 1e-7)
        if self.remembered is not None:
            return max(self.remembered, 1e-7)
        return None

    def _holds_values(self) -> bool:
        return not self._handed_over and bool(self._pending or self._results or self.errors or self.failed_items)

    def _settle_last(self) -> None:
        """Hold this job strongly as :func:`.observers.last_job` only where it should outlive its caller (see there)."""
        observers.settle(self, self.finished and (self.state != "finished" or not self._holds_values()))

    # -- write -----------------------------------------------------------------------------
    def _store(self, start: int, r: ChunkResult) -> None:
        """Count a chunk's results (``r``: its first ``len(r.values)`` items ran); items' failures are the caller's."""
        values, timings, outputs, errors, worker = r.values, r.timings, r.outputs, r.errors, r.worker
        n = len(values)
        busy = sum(k * each for k, each in timings)
        self.chunk_log.append((start, n, worker, r.started, busy))
        if worker:
            self.workers_used[worker] = self.workers_used.get(worker, 0) + n
        self._durations.append((start, timings))
        self._time_sum += busy
        self._time_n += n
        self._pending.append((start, values))  # filed by index when read (``results``)
        if not self.ordered:
            idx = range(start, start + n)
            self._completion.extend(idx)
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

    def _call_output(self, index: int, text: str, failed: bool) -> None:
        callback = self.on_output
        if callback is None:
            return
        try:
            callback(index, text, failed)
        except Exception:
            logger.exception("jupyter_cluster: output callback failed")

    def _item_error(self, index: int, item: Any, info: tuple, worker: str | None) -> BaseException:
        """The exception of a failed item (its remote traceback noted on it), kept in ``tracebacks`` and ``failed_items``."""
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
        return exc

    def _count_failure(self, index: int, exc: BaseException, in_results: bool = False) -> None:
        """Count a failed item (``in_results``: its chunk's result already listed it in completion order)."""
        self.results[index] = exc
        if not in_results and not self.ordered:
            self._completion.append(index)
            self._order.append(index)
        self.failed += 1
        self.errors[index] = exc
        if self.on_output is not None:
            self._call_output(index, self.outputs.get(index, ""), True)
