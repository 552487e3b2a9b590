"""The task path: one Dask task per chunk (the fallback, and ``--all-workers`` cells).

Used when the workers cannot be reached directly from the notebook (only
the scheduler can) and for chunks pinned to one worker each.  Dask's
per-task cost is paid per chunk, not per item.  Completions are tracked
with ``as_completed`` (completion only), and results fetched per drained
batch of completions in one gather, in slices, so that a slow gather (a
swamped scheduler) is never cancelled and retried while a lost scheduler
ends it within a slice.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from typing import Any

from distributed import as_completed

from .cluster import (
    Scattered,
    cancel_futures,
    client_loop,
    client_running,
    future_error,
    gather_skipping_errors,
    is_killed_worker,
    total_threads,
)
from .dispatch import Cancelled, Chunk, Counters, Done, Failed, Killed, MapEvent, MapSpec
from .protocol import ChunkResult, Items, MapRun
from .worker import run_items

#: While a batch of results is being fetched, look at the scheduler this often, in seconds.
FETCH_CHECK_SECONDS = 1.0
#: A task that ended (error, cancelled) but was never reported is reported after this many seconds.
STALE_SECONDS = 1.0


class TaskDispatcher:
    """The task path behind :class:`.dispatch.Dispatcher`.

    Parameters
    ----------
    spec : MapSpec
        The map: its client, its id (which names the tasks,
        ``jc-<map_id>-<n>``), its :class:`.protocol.MapRun` (passed whole
        to each task, with the map's large values as scattered now: a
        worker that lost them has them scattered again), its resources,
        its concurrency (most chunks in flight, ``Pool(processes=N)``) and
        the check that raises the map's "scheduler lost" error (called
        between fetch slices).
    """

    name = "tasks"
    unit = "task"
    holds_threads = False

    def __init__(self, spec: MapSpec):
        client = self.client = spec.client
        self.map_id = spec.map_id
        self.run: MapRun = spec.run
        self.shared: Scattered = spec.shared
        self.resources = spec.resources
        self.concurrency = spec.concurrency
        self.check = spec.check
        self.submitted = 0
        # Completion only: results are fetched per drained batch (one gather for many chunks).
        self.ac = as_completed(with_results=False, loop=client.loop)
        self.pending: set = set()  # futures sent and not reported yet
        self._threads = total_threads(client)
        self._threads_checked = time.monotonic()
        self._terminal_since: dict[str, float] = {}
        self._stale_checked = time.monotonic()

    # -- the protocol -------------------------------------------------------------------
    def threads(self) -> int:
        now = time.monotonic()
        if now - self._threads_checked > 2.0:
            self._threads_checked = now
            self._threads = total_threads(self.client)
        return self._threads

    def room(self, in_flight: int) -> int:
        """Up to ``2 × threads + 2`` chunks in flight: one running and one queued per thread, plus slack."""
        n = 2 * self.threads() + 2
        if self.concurrency is not None:
            n = min(n, self.concurrency)
        return max(n - in_flight, 0)

    def sizing(self, remaining: int | None, round_remaining: int | None, per_item: float | None, idle: bool) -> dict:
        # The scheduler's pace, not the client's: the planner's defaults, the work left now.
        return {"remaining": remaining, "spread": 2 * self._threads}

    def prepare(self, more_work: bool) -> list[MapEvent]:
        return []

    def send(self, chunks: list[Chunk]) -> list[Any]:
        """Chunks as Dask tasks: pinned and suspect ones one by one, the others in one ``client.map``."""
        if not chunks:
            return []
        run = self.run
        big = self.shared.current()
        resources = self.resources
        first = self.submitted
        keys = [f"jc-{self.map_id}-{first + k}" for k in range(len(chunks))]
        out: list = [None] * len(chunks)
        plain = []
        for k, c in enumerate(chunks):
            if c.pin is None and not c.suspect:
                plain.append(k)
                continue
            kwargs: dict[str, Any] = {"pure": False, "key": keys[k]}
            if resources:
                kwargs["resources"] = resources
            if c.pin is not None:
                kwargs["workers"] = [c.pin]
                kwargs["allow_other_workers"] = False
            out[k] = self.client.submit(run_items, Items(c.items, c.budget), run, big, **kwargs)
        if plain:
            kwargs = {"resources": resources} if resources else {}
            futures = self.client.map(
                run_items,
                [Items(chunks[k].items, chunks[k].budget) for k in plain],
                key=[keys[k] for k in plain],
                pure=False,
                run=run,
                big=big,
                **kwargs,
            )
            for k, fut in zip(plain, futures):
                out[k] = fut
        self.ac.update(out)
        self.pending.update(out)
        self.submitted += len(chunks)
        return out

    def poll(self, timeout: float) -> list[MapEvent]:
        """Tasks that ended: waits up to ``timeout`` for completions, then fetches their results in one gather."""
        batch = self._wait(timeout)
        if not batch:
            return []
        return self._fetch(batch)

    def cancel(self, handle: Any) -> None:
        self.pending.discard(handle)
        handle.cancel()

    def close(self, pending: list[Any], keep: bool = False) -> None:
        if pending:
            cancel_futures(self.client, pending, "jupyter-cluster map stopped")
        self.pending.clear()

    def forget_function(self) -> None:
        self.run = self.run.without_function()

    def stats(self) -> Counters:
        return Counters()  # no leases, no relays

    # -- waiting and fetching -----------------------------------------------------------
    def _wait(self, timeout: float) -> list:
        """Futures that completed within ``timeout`` seconds (or ended unreported: a safety net)."""
        ac = self.ac
        cond = ac.thread_condition
        # The condition is held only to look at the queue: as_completed's callbacks on the client's
        # loop take this same condition, and a check that needs that loop while holding it deadlocked maps.
        with cond:
            if ac.queue.empty():
                cond.wait(timeout)
            ready = not ac.queue.empty()
        if not ready:
            return self._stale()
        batch = []
        while not ac.queue.empty():
            batch.append(ac.queue.get_nowait())
        return batch

    def _stale(self) -> list:
        """Futures that ended more than a second ago but were never reported (a safety net)."""
        now = time.monotonic()
        if now - self._stale_checked <= STALE_SECONDS:
            return []
        self._stale_checked = now
        out = []
        for fut in self.pending:
            if fut.status in ("error", "cancelled"):
                first = self._terminal_since.setdefault(fut.key, now)
                if now - first > STALE_SECONDS:
                    out.append(fut)
        return out

    def _fetch(self, futures: list) -> list[MapEvent]:
        """Events for the ended ``futures``: the finished ones' results fetched in one gather.

        A chunk whose result was lost with its worker between finishing and
        the fetch is being re-run by Dask; it goes back to the completion
        tracker and is reported again when it is done.
        """
        done: list = []
        out: list[MapEvent] = []
        for f in futures:
            status = f.status
            if status == "finished":
                if f in self.pending:
                    done.append(f)
            elif status in ("error", "cancelled"):
                out.append(self._ended(f))
            else:  # reported, then reset: Dask is re-running it after losing its result
                self.ac.add(f)
        if not done:
            return out
        try:
            data = self._gather(done)
        except Exception as exc:  # noqa: BLE001 - sorted out below
            self.check()  # a lost scheduler ends the map
            if not isinstance(exc, OSError) and client_running(self.client):
                raise
            data = {}  # the fetch failed (a worker went away): every chunk of the batch is reported again
        for f in done:
            value = data.get(f.key)
            if value is not None:
                self._forget(f)
                out.append(Done(f, ChunkResult._make(value)))  # a plain tuple on the wire (see .protocol)
            elif f.status in ("error", "cancelled"):
                out.append(self._ended(f))
            else:
                self.ac.add(f)
        return out

    def _ended(self, fut: Any) -> MapEvent:
        self._forget(fut)
        if fut.status == "error":
            exc = future_error(fut)
            return Killed(fut, exc) if is_killed_worker(exc) else Failed(fut, exc)
        return Cancelled(fut)

    def _forget(self, fut: Any) -> None:
        self.pending.discard(fut)
        self._terminal_since.pop(fut.key, None)

    def _gather(self, futures: list) -> dict:
        """Key -> result of the finished ``futures`` (errors skipped), waiting in slices with the scheduler checked between."""
        pending = asyncio.run_coroutine_threadsafe(
            gather_skipping_errors(self.client, {f.key: f for f in futures}), client_loop(self.client)
        )
        try:
            while True:
                try:
                    return pending.result(timeout=FETCH_CHECK_SECONDS)
                except concurrent.futures.TimeoutError:
                    self.check()
        finally:
            if not pending.done():
                pending.cancel()
