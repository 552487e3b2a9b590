"""The map's loop without a cluster: a :class:`MapJob` driven through a fake port and scripted dispatcher events.

The seam is the design's (``engine/dispatch.py``'s ``Dispatcher``, reached
through ``engine/port.py``'s ``ClusterPort``): the fake dispatcher runs each
chunk's items here, in the test's thread, or answers with the event the test
scripts for it (:class:`Done`, :class:`Failed`, :class:`Died`, :class:`Killed`, :class:`Retry`,
:class:`Fallback`, :class:`Cancelled`: one typed event class per outcome), as
distributed tests its worker state machine without a network.  What the real
paths do on a real cluster is tested in ``tests/engine``.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable
from typing import Any

import pytest

from jupyter_cluster.engine import observers
from jupyter_cluster.engine.cluster import Scattered
from jupyter_cluster.engine.dispatch import (
    Cancelled,
    Chunk,
    ChunkEvent,
    Counters,
    Died,
    Done,
    Failed,
    Fallback,
    Killed,
    MapEvent,
    Retry,
)
from jupyter_cluster.engine.job import MapJob
from jupyter_cluster.engine.protocol import ChunkResult
from jupyter_cluster.errors import ClusterError, WorkerLostError

pytestmark = pytest.mark.timeout(30)  # a map that never ends fails here, not after the suite's 300 s

#: ``script(chunk, attempt) -> event`` (a ``handle -> MapEvent`` such as ``Retry`` or
#: ``functools.partial(Failed, error=...)``) or None (run the chunk here: :class:`Done`).
Script = Callable[[Chunk, int], Callable[[Any], MapEvent] | None]


def ran(fn: Callable, chunk: Chunk, upto: int | None = None) -> ChunkResult:
    """What a worker returns for ``chunk``: its items run here, the first ``upto`` only."""
    values, errors = [], {}
    for pos, item in enumerate(chunk.items[:upto]):
        try:
            values.append(fn(item))
        except Exception as exc:  # noqa: BLE001 - an item's failure travels back, as a worker's would
            values.append(exc)
            errors[pos] = (exc, type(exc).__qualname__, str(exc), f"Traceback: {exc!r}\n", None)
    return ChunkResult(values, [(1, 0.001)] * len(values), None, errors or None, "tcp://fake:1", 0.0)


class FakeDispatcher:
    """A :class:`~jupyter_cluster.engine.dispatch.Dispatcher` whose chunks are answered at the next poll."""

    unit = "batch"
    holds_threads = False

    def __init__(self, port: FakePort, name: str):
        self.port, self.name = port, name
        self.sent: list[Chunk] = []
        self.rounds: list[list[int]] = []  # each send's chunk starts
        self.waiting: list[tuple[int, Chunk]] = []  # sent, answered at the next poll (newest first)
        self.closed: list[tuple[list, bool]] = []
        self.cancelled: list[int] = []
        self.prepare_events: list[MapEvent] = []
        self.most_in_flight = 0
        self._handles = itertools.count()

    def threads(self) -> int:
        return 2

    def room(self, in_flight: int) -> int:
        self.most_in_flight = max(self.most_in_flight, in_flight)
        return max(0, 4 - in_flight)

    def sizing(self, remaining: int | None, round_remaining: int | None, per_item: float | None, idle: bool) -> dict:
        return {"remaining": remaining, "spread": 4}

    def prepare(self, more_work: bool) -> list[MapEvent]:
        events, self.prepare_events = self.prepare_events, []
        return events

    def send(self, chunks: list[Chunk]) -> list[Any]:
        handles = []
        self.rounds.append([c.start for c in chunks])
        for chunk in chunks:
            handle = next(self._handles)
            self.sent.append(chunk)
            self.waiting.append((handle, chunk))
            handles.append(handle)
        return handles

    def poll(self, timeout: float) -> list[MapEvent]:
        if self.port.interrupt_at is not None and len(self.port.polls) >= self.port.interrupt_at:
            raise KeyboardInterrupt
        self.port.polls.append(self.name)
        assert len(self.port.polls) < 2000, "the map polled 2,000 times without ending: a chunk is lost or loops"
        if self.port.silent(self):
            time.sleep(0.01)  # as a real poll waits: the map's half-second checks come round
            return []
        events: list[MapEvent] = []
        # Newest first by default: results come back out of input order.
        for handle, chunk in reversed(self.waiting) if self.port.newest_first else self.waiting:
            attempt = self.port.attempts.get(chunk.start, 0)
            self.port.attempts[chunk.start] = attempt + 1
            scripted = self.port.script(chunk, attempt) if self.port.script else None
            if scripted is None:
                events.append(Done(handle, ran(self.port.fn, chunk)))
            else:
                events.append(scripted(handle))
        self.waiting = []
        return events

    def cancel(self, handle: Any) -> None:
        self.cancelled.append(handle)

    def close(self, pending: list[Any], keep: bool = False) -> None:
        self.closed.append((list(pending), keep))
        self.waiting = []

    def forget_function(self) -> None:
        pass

    def stats(self) -> Counters:
        return Counters()


class FakePort:
    """A :class:`~jupyter_cluster.engine.port.ClusterPort` with no cluster behind it."""

    client = None
    cluster = "fake"

    def __init__(self, fn: Callable, script: Script | None = None, allowed: int = 1):
        self.fn, self.script, self.allowed = fn, script, allowed
        self.direct = FakeDispatcher(self, "direct")
        self.tasks = FakeDispatcher(self, "tasks")
        self.attempts: dict[int, int] = {}  # chunk start -> times it was answered
        self.polls: list[str] = []
        self.interrupt_at: int | None = None  # raise KeyboardInterrupt at this poll
        self.silent: Callable[[FakeDispatcher], bool] = lambda d: False  # answer nothing this poll
        self.gone = False
        self.newest_first = True  # the order a poll answers the chunks sent

    def scatter(self, values: dict) -> Scattered:
        return Scattered(None, {})  # the test's functions are small: no large value to send

    def dispatcher(self, spec: Any, *, pinned: bool, empty: bool) -> FakeDispatcher:
        return self.direct

    def fallback(self, spec: Any) -> FakeDispatcher:
        return self.tasks

    def allowed_failures(self) -> int:
        return self.allowed

    def running(self) -> bool:
        return True

    def lost(self) -> bool:
        return self.gone

    def lost_error(self, lost: str, redo: str) -> ClusterError:
        return ClusterError(f"the scheduler stopped answering: {lost}; {redo}.")

    def workers(self) -> dict[str, dict]:
        return {"tcp://fake:1": {"status": "running", "nthreads": 2}}

    def threads(self) -> int:
        return 2

    def adaptive(self) -> bool:
        return False


def square(x: int) -> int:
    if x == 13:
        raise ValueError("thirteen")
    return x * x


def cube(x: int) -> int:
    return x**3


def job_of(port: FakePort, items: Any, **options: Any) -> MapJob:
    options.setdefault("chunksize", 2)
    return MapJob(port.fn, (items,), progress=False, port=port, **options)


def test_results_come_in_input_order_though_chunks_finish_out_of_it():
    port = FakePort(square)
    job = job_of(port, range(10), retain=False)
    assert list(job) == [x * x for x in range(10)]
    assert job.state == "finished" and job.done == 10 and job.failed == 0 and job.path == "direct"
    assert [c.start for c in port.direct.sent] == [0, 2, 4, 6, 8]
    assert job.peak_in_flight == 4  # never more than the dispatcher had room for
    assert port.direct.closed == [([], True)]  # finished: the leases are kept for the next map
    assert observers.last_job() is job

    unordered = job_of(FakePort(square), range(10), ordered=False)
    got = list(unordered)
    assert sorted(got) == [x * x for x in range(10)] and got != sorted(got)  # completion order
    assert unordered.result_list() == got


def test_a_generator_of_unknown_length_is_read_lazily_and_its_end_found():
    port = FakePort(abs)
    job = job_of(port, (-x for x in range(100)), chunksize=3)
    assert job.total is None
    assert next(job) == 0
    assert job.items_read == 12  # what the first round sent, no more
    assert list(job) == list(range(1, 100))
    assert job.total == 100


def test_an_item_error_raises_and_stops_the_map_or_is_collected():
    port = FakePort(square)
    job = job_of(port, range(20), retain=False)
    with pytest.raises(ValueError, match="thirteen") as info:
        list(job)
    assert any("item 13 (13) failed on worker tcp://fake:1" in n for n in getattr(info.value, "__notes__", []))
    assert job.state == "failed" and job.finished
    assert port.direct.closed and port.direct.closed[-1][1] is False  # outstanding work cancelled
    assert observers.last_job() is job  # a failed map keeps its partial results reachable

    collected = job_of(FakePort(square), range(20), errors="collect")
    out = collected.run().result_list()
    assert isinstance(out[13], ValueError) and out[12] == 144 and out[19] == 361
    assert collected.failed == 1 and collected.done == 19
    assert collected.failed_items[13] == (13, "tcp://fake:1") and "thirteen" in collected.tracebacks[13][0]


def test_a_chunk_that_did_not_run_is_sent_again():
    port = FakePort(square, script=lambda c, attempt: Retry if c.start == 4 and attempt < 2 else None)
    job = job_of(port, range(10))
    assert job.run().result_list() == [x * x for x in range(10)]
    assert [c.start for c in port.direct.sent].count(4) == 3
    assert job.failed == 0


def test_a_chunk_whose_workers_die_is_split_and_its_poison_item_alone_fails():
    # Item 5 kills every worker that runs it; allowed-failures is 1.
    def script(chunk: Chunk, attempt: int) -> Any:
        return Died if 5 in chunk.items else None

    port = FakePort(square, script=script, allowed=1)
    job = job_of(port, range(8), errors="collect")
    out = job.run().result_list()
    assert isinstance(out[5], WorkerLostError) and "item 5 (5) killed 2 worker processes" in str(out[5])
    assert [v for i, v in enumerate(out) if i != 5] == [x * x for x in range(8) if x != 5]
    suspects = [c for c in port.direct.sent if c.suspect]
    assert [c.start for c in suspects] == [4, 5, 5]  # run alone, innocent item 4 first
    assert job.failed == 1 and job.failed_items[5] == (5, None)


def test_a_chunk_dask_gave_up_on_is_split_and_the_item_killed_again_fails():
    def script(chunk: Chunk, attempt: int) -> Any:
        if 3 in chunk.items:
            return functools.partial(Killed, error=RuntimeError("KilledWorker"))
        return None

    port = FakePort(square, script=script)
    job = job_of(port, range(6), errors="collect")
    out = job.run().result_list()
    assert isinstance(out[3], WorkerLostError) and "item 3 (3)" in str(out[3])
    assert out[2] == 4 and out[5] == 25
    # Only one suspect in flight at a time, so a death is its own.
    assert [c.start for c in port.direct.sent if c.suspect] == [2, 3]


def test_a_batch_that_failed_as_a_whole_fails_each_of_its_items():
    error = TypeError("cannot pickle 'generator' object")
    port = FakePort(square, script=lambda c, attempt: functools.partial(Failed, error=error) if c.start == 2 else None)
    job = job_of(port, range(6), errors="collect")
    out = job.run().result_list()
    assert out[2] is error and out[3] is error and out[4] == 16
    assert "the batch running items 2..3 failed as a whole" in "".join(error.__notes__)
    assert job.failed == 2


def test_the_fallback_swaps_to_the_task_path_and_sends_the_chunks_in_flight_again():
    port = FakePort(square)
    port.silent = lambda d: d.name == "direct"  # the leases never answer: the workers cannot be reached
    job = job_of(port, range(12))
    job._step()  # the first round goes out on the direct path
    in_flight = [c.start for c in port.direct.sent]
    assert in_flight == [0, 2, 4, 6] and job.path == "direct"
    port.direct.prepare_events = [Fallback()]
    assert job.run().result_list() == [x * x for x in range(12)]
    assert job.path == "tasks" and port.direct.closed == [([], False)]
    assert [c.start for c in port.tasks.sent][:4] == in_flight  # the chunks in flight, sent again first
    assert sorted(c.start for c in port.tasks.sent) == [0, 2, 4, 6, 8, 10]  # each taken once


def test_chunks_the_cluster_cancels_are_sent_again_a_few_times_then_the_map_fails():
    port = FakePort(square, script=lambda c, attempt: Cancelled if c.start == 2 and attempt < 2 else None)
    assert job_of(port, range(6)).run().result_list() == [x * x for x in range(6)]

    always = FakePort(square, script=lambda c, attempt: Cancelled if c.start == 2 else None)
    job = job_of(always, range(6))
    with pytest.raises(ClusterError, match=r"cancelled the chunk with items 2\.\.3 4 times"):
        job.run()
    assert job.state == "failed"


@pytest.mark.parametrize("newest_first", [True, False])
def test_a_budget_that_ran_out_sends_the_rest_back_in_input_order(newest_first: bool):
    def cut(chunk: Chunk, attempt: int) -> Any:
        half = max(1, len(chunk.items) // 2)
        return (
            functools.partial(Done, result=ran(cube, chunk, upto=half))
            if chunk.budget is not None and attempt == 0
            else None
        )

    port = FakePort(cube, script=cut)  # mapped nowhere else: no remembered duration, so probes first
    port.newest_first = newest_first
    job = job_of(port, range(40), chunksize="auto")
    assert job.run().result_list() == [x**3 for x in range(40)]
    assert job.chunks_cut >= 1
    # What came back (newest first) goes out again in input order, before what was never sent (issue 37).
    assert len(port.direct.rounds) > 1 and all(r == sorted(r) for r in port.direct.rounds)
    assert job.done == 40 and sum(n for _, n, *_ in job.chunk_log) == 40


def test_interrupt_cancels_what_is_in_flight_and_keeps_the_results_so_far():
    port = FakePort(square)
    port.interrupt_at = 1  # the first poll answers, the second is interrupted
    job = job_of(port, range(20))
    with pytest.raises(KeyboardInterrupt):
        job.run()
    assert job.state == "cancelled" and job.results == {i: i * i for i in range(8)}
    pending, keep = port.direct.closed[-1]
    assert len(pending) == 4 and keep is False
    assert observers.last_job() is job and job.in_flight == 0


def test_stop_and_drain():
    port = FakePort(square)
    job = job_of(port, range(20), ordered=False, retain=False)
    first = job.drain()
    assert sorted(first) == [(i, i * i) for i in range(8)] and job.results == {}
    port.silent = lambda d: True
    assert job.drain() == [] and job.in_flight == 4
    job.cancel()
    assert job.state == "cancelled" and job.finished and job.drain() == []
    pending, keep = port.direct.closed[-1]
    assert len(pending) == 4 and keep is False


def test_a_lost_scheduler_fails_the_map_saying_what_was_done():
    port = FakePort(square)
    job = job_of(port, range(10))
    assert next(job) == 0
    port.gone = True
    port.silent = lambda d: True  # nothing answers any more
    with pytest.raises(ClusterError, match="stopped answering: 8 of 10 items were done"):
        job.run()
    assert job.state == "failed"


def test_every_outcome_is_a_typed_event_and_an_unknown_one_is_refused():
    # One class per outcome, each carrying only its own fields: a chunk's result is a ChunkResult, not Any.
    done = Done(0, ran(square, Chunk(0, [2, 3])))
    assert done.result.values == [4, 9] and done.result.worker == "tcp://fake:1"
    with pytest.raises(AttributeError):
        done.handle = 1  # type: ignore[misc]  # frozen: a report is not changed on its way to the loop

    class Strange(ChunkEvent):  # an outcome the loop was not taught
        pass

    port = FakePort(square, script=lambda c, attempt: Strange if c.start == 2 else None)
    with pytest.raises(TypeError, match="unknown map event"):
        job_of(port, range(6)).run()


def test_results_and_durations_come_back_per_chunk_and_read_per_item():
    # A worker times a chunk's quick items per slice, (items, seconds each), not one float per item; the
    # record keeps each chunk's values as they came and files them by index only when asked.
    def sliced(chunk: Chunk, attempt: int) -> Any:
        values = [x * x for x in chunk.items]
        result = ChunkResult(values, [(1, 0.5), (len(values) - 1, 0.25)], None, None, "tcp://fake:1", 0.0)
        return functools.partial(Done, result=result)

    port = FakePort(square, script=sliced)
    job = job_of(port, range(10), chunksize=5)
    assert job.run().result_list() == [x * x for x in range(10)]
    assert job.durations == {0: 0.5, 1: 0.25, 2: 0.25, 3: 0.25, 4: 0.25, 5: 0.5, 6: 0.25, 7: 0.25, 8: 0.25, 9: 0.25}
    assert job.durations_below(6) == {i: d for i, d in job.durations.items() if i < 6}
    assert sum(busy for *_, busy in job.chunk_log) == 2 * (0.5 + 4 * 0.25)
    assert job.results == {x: x * x for x in range(10)}  # every value by index, once read
    assert job.take_results() == [x * x for x in range(10)] and job.results == {}


def test_a_sweeps_tap_and_origin_are_arguments_of_the_map_its_record_reads():
    # No thread-local around making the map: what its record names travels with the job itself.
    from jupyter_cluster.tracking.record import job_context
    from jupyter_cluster.tracking.tags import ItemTag, ItemTap

    tap = ItemTap(range(4), ItemTag("run-tap", "x"))
    origin = {"notebook": "far.ipynb", "cell": {"n": 3}, "kernel_id": "k-1"}
    job = job_of(FakePort(square), tap, tap=tap, origin=origin)
    assert job.run().result_list() == [0, 1, 4, 9]
    context = job_context(job)
    assert (context["run"], context["notebook"], context["kernel_id"]) == ("run-tap", "far.ipynb", "k-1")
    plain = job_context(job_of(FakePort(square), range(2)))
    assert plain["run"] != "run-tap" and "kernel_id" not in plain


def test_a_list_is_sliced_in_place_and_behaves_as_any_other_input():
    # One list: chunks are cut from it with no read-ahead copy; order, retries, a poison item's split and
    # a budget's sent-back items come out as for an iterator (the other tests use ranges).
    items = list(range(10))
    job = job_of(FakePort(square), items, retain=False)
    assert job._window.sequence is items and job._window.buffer == []
    assert list(job) == [x * x for x in range(10)] and [c.start for c in job._port.direct.sent] == [0, 2, 4, 6, 8]
    assert job.items_read == 10 and job._window.sequence is None  # the map let go of the caller's list

    poison = FakePort(square, script=lambda c, attempt: Died if 5 in c.items else None, allowed=1)
    out = job_of(poison, list(range(8)), errors="collect").run().result_list()
    assert isinstance(out[5], WorkerLostError) and [v for i, v in enumerate(out) if i != 5] == [
        x * x for x in range(8) if x != 5
    ]

    def cut(chunk: Chunk, attempt: int) -> Any:
        upto = max(1, len(chunk.items) // 2)
        return functools.partial(Done, result=ran(cube, chunk, upto)) if chunk.budget and not attempt else None

    budget = job_of(FakePort(cube, script=cut), list(range(40)), chunksize="auto")
    assert budget.run().result_list() == [x**3 for x in range(40)] and budget.chunks_cut >= 1

    interrupted = FakePort(square)
    interrupted.interrupt_at = 1
    job = job_of(interrupted, list(range(20)))
    with pytest.raises(KeyboardInterrupt):
        job.run()
    assert job.state == "cancelled" and job.results == {i: i * i for i in range(8)}


def test_items_appended_to_a_list_while_it_is_mapped_are_not_read():
    items = list(range(6))
    job = job_of(FakePort(square), items)
    assert next(job) == 0
    items.extend([100, 200])  # the map's length was taken when it started
    assert list(job) == [x * x for x in range(1, 6)] and job.total == 6
