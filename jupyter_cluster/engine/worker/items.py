"""One chunk's run on a worker, as one value: what its two loops read and fill, and its one output capture.

:class:`ItemsRun` is what the per-item loop (:func:`.run._run_items`) and the
slices (:func:`.slices.run_slices`) share: the function, the items, the
stop, the budget and cancellation checks, and what came out (values, errors,
timings, printed output).  Both loops file output the same way, through one
:class:`ItemOutputs` set as the thread's capture for the whole chunk: a write
goes to the item running then, whose position is ``len(values)``.

Timings are runs of ``(items, seconds each)``: ``(1, d)`` per item of the
per-item loop, one ``(n, mean)`` per slice, so a chunk of 10^5 quick items
sends a few dozen pairs back, not 10^5 floats (the client expands them only
where it is asked for items' durations).
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable
from typing import Any

#: Most characters of printed output kept per item (the rest is counted and dropped).
MAX_OUTPUT_CHARS = 1_000_000


class Capture:
    """One item's captured output (bounded); its buffer is made on the first write."""

    __slots__ = ("buf", "size")

    def __init__(self):
        self.buf: io.StringIO | None = None
        self.size = 0

    def write(self, s: str) -> int:
        if self.buf is None:
            self.buf = io.StringIO()
        n = len(s)
        if self.size < MAX_OUTPUT_CHARS:
            room = MAX_OUTPUT_CHARS - self.size
            self.buf.write(
                s
                if n <= room
                else s[:room] + f"\n[jupyter_cluster: output beyond {MAX_OUTPUT_CHARS:,} characters dropped]\n"
            )
        self.size += n
        return n

    def getvalue(self) -> str:
        return self.buf.getvalue() if self.buf is not None else ""


class ItemOutputs:
    """What a chunk's items print, filed under the item running when it is written (``len(values)``).

    Most items print nothing: nothing is made per item until one writes.
    """

    __slots__ = ("values", "captures")

    def __init__(self, values: list):
        self.values = values
        self.captures: dict[int, Capture] = {}

    def write(self, s: str) -> int:
        pos = len(self.values)
        cap = self.captures.get(pos)
        if cap is None:
            cap = self.captures[pos] = Capture()
        return cap.write(s)

    def flush(self) -> None:
        pass

    def restart(self) -> None:
        """Forget what the running item wrote (a retried item keeps only its last attempt's output)."""
        self.captures.pop(len(self.values), None)

    def of(self, pos: int) -> Capture:
        """The capture of item ``pos`` alone (an item run in a helper thread that may outlive its --timeout)."""
        cap = self.captures.get(pos)
        if cap is None:
            cap = self.captures[pos] = Capture()
        return cap

    def texts(self, below: int) -> dict[int, str]:
        """Position -> printed text, for the items before ``below`` that printed something."""
        return {pos: text for pos, cap in sorted(self.captures.items()) if pos < below and (text := cap.getvalue())}


class ItemsRun:
    """One chunk's run: its inputs and checks, and what its loops appended (see the module's text)."""

    __slots__ = (
        "fn",
        "items",
        "star",
        "retries",
        "runner",
        "cancelled",
        "stop",
        "deadline",
        "next_check",
        "error_info",
        "values",
        "timings",
        "errors",
        "outputs",
    )

    def __init__(
        self,
        fn: Callable,
        items: Any,
        *,
        star: bool = False,
        retries: int = 0,
        runner: Any = None,
        cancelled: Callable[[], bool] = lambda: False,
        stop: threading.Event | None = None,
        deadline: float = float("inf"),
        next_check: float = float("inf"),
        capture: bool = True,
        error_info: Callable[[BaseException], tuple],
    ):
        self.fn = fn
        self.items = items
        self.star = star
        self.retries = retries
        self.runner = runner  # a .run._TimedRunner for --timeout, else None
        self.cancelled = cancelled
        self.stop = stop  # set by Pool.terminate() / the map's stop: the rest of the chunk is not run
        self.deadline = deadline  # perf_counter() time of the chunk's budget
        self.next_check = next_check  # when to ask cancelled() next
        self.error_info = error_info  # an exception as an ItemError's fields (.run.error_info)
        self.values: list = []
        self.timings: list[tuple[int, float]] = []  # (items, seconds each), in item order
        self.errors: dict[int, tuple] = {}
        self.outputs = ItemOutputs(self.values) if capture else None

    def timed(self) -> int:
        """Items whose timing is in :attr:`timings` (each item appends its value first)."""
        return sum(n for n, _ in self.timings)

    def result(self, worker: str | None, started: float, complete: bool = True) -> tuple:
        """A :class:`..protocol.ChunkResult`'s fields as a plain tuple.

        ``complete`` False: a helper thread may still be adding the item it
        was in (a stopped group): only the items with a value and a timing count.
        """
        values, timings, errors = self.values, self.timings, self.errors
        if complete:
            n = len(values)
        else:
            timings = list(timings)
            n = min(len(values), sum(k for k, _ in timings))
            values = values[:n]
            timings = _first(timings, n)
            errors = {p: e for p, e in list(errors.items()) if p < n}
        outputs = self.outputs.texts(n) if self.outputs is not None else None
        return (values, timings, outputs or None, errors or None, worker, started)


def _first(timings: list[tuple[int, float]], n: int) -> list[tuple[int, float]]:
    """The runs of the first ``n`` items of ``timings``."""
    out = []
    for k, each in timings:
        if n <= 0:
            break
        out.append((min(k, n), each))
        n -= k
    return out
