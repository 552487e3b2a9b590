"""A map's input window: the items read ahead of what was sent, and those a time budget sent back.

The input is read lazily, a bounded distance ahead of what was sent, so
that the end of a generator is seen while there is time to shrink the last
chunks, and memory stays bounded by about (chunks in flight + 1) ×
:data:`.planner.MAX_CHUNK_ITEMS` items.  Items a chunk's time budget sent
back are kept sorted by input index (issue 37: newest first, the leftovers of
the last probe ran before item 2) and go out again before what was never
sent.  The probes of a map share one probe's items, each half of what is left.
"""

from __future__ import annotations

import itertools
from bisect import insort
from collections import deque
from collections.abc import Iterator
from operator import itemgetter
from typing import Any

from . import planner
from .cluster import item_bytes
from .dispatch import Chunk


class InputWindow:
    """Where one map's next items come from.

    Parameters
    ----------
    source : iterator
        The input (``zip`` of the iterables for a map over several).
    total : int or None
        Its length, when known up front.
    pin : list of str, optional
        ``run_on_workers``: one item per worker address, each pinned there.
    sequence : list, optional
        The input itself when it is one ``list``: chunks are cut from it by
        slicing, with no read-ahead copy (10^6 items: one copy instead of two).
    """

    def __init__(self, source: Iterator, total: int | None, pin: list[str] | None = None, sequence: list | None = None):
        self.source = source
        self.sequence = sequence
        self._end = len(sequence) if sequence is not None else 0  # items appended during the map are not read
        #: Number of items, None until the end of the input is seen.
        self.total = total
        self.pin = pin
        # Items read and not yet sent: ``buffer[head:]`` (a list sliced in C; a deque cut at a chunk's
        # end copied what was read ahead of it, four chunks' worth, for every chunk).
        self.buffer: list = []
        self.head = 0
        self.exhausted = False
        self.next_index = 0  # index of the first buffered (unsubmitted) item
        self.items_read = 0
        self.returned: deque[tuple[int, list]] = deque()  # (first index, items) a budget sent back
        self.returned_n = 0
        self._probe_items: int | None = None

    def sent_all(self) -> bool:
        """Nothing left of the input, read or unread (chunks in flight or sent back aside)."""
        if self.sequence is not None:
            return self.exhausted or self.next_index >= self._end
        return self.exhausted and self.head >= len(self.buffer)

    def remaining(self) -> int | None:
        """Items left to send (None while the end of the input is unknown)."""
        if self.total is not None:
            return self.total - self.next_index + self.returned_n
        if self.exhausted:
            return len(self.buffer) - self.head + self.returned_n
        return None

    def next_pinned(self) -> Chunk | None:
        """The next ``run_on_workers`` chunk (one item, pinned to its worker); None once each was made."""
        assert self.pin is not None
        if self.next_index >= len(self.pin):
            self.exhausted = True
            return None
        i = self.next_index
        self.next_index += 1
        self.items_read += 1
        return Chunk(i, [self.pin[i]], pin=self.pin[i])

    def next_chunk(self, size: int, budget: float | None, ahead: int) -> Chunk | None:
        """A chunk of ``size`` items: sent-back ones first, else read anew (``ahead`` more read ahead)."""
        if self.returned:
            start, items = self._take_returned(size)
        else:
            items = self._take(size, ahead)
            start = self.next_index - len(items)
        if not items:
            return None
        return Chunk(start, items, budget=budget)

    def give_back(self, start: int, items: list) -> None:
        """Items a chunk's time budget sent back: out again in input order, before what was never sent."""
        insort(self.returned, (start, items), key=itemgetter(0))
        self.returned_n += len(items)

    def probe_size(self) -> int:
        """Items of the next probe: the probes of a map share one probe's items, each half of what is left."""
        if self._probe_items is None:
            if self.head >= len(self.buffer) and not self.exhausted:
                self._take_ahead(1)
            if self.returned:
                first = self.returned[0][1][0]
            elif self.sequence is not None:
                first = self.sequence[self.next_index] if self.next_index < min(self._end, len(self.sequence)) else None
            else:
                first = self.buffer[self.head] if self.head < len(self.buffer) else None
            self._probe_items = planner.probe_items(item_bytes(first) if first is not None else 1)
        share = max(1, (self._probe_items + 1) // 2)
        self._probe_items = max(self._probe_items - share, 1)
        return share

    def drop_returned(self) -> None:
        """Forget the items sent back (the map stopped)."""
        self.returned.clear()
        self.returned_n = 0

    def drop(self) -> None:
        """Let go of the caller's input and every item held (the map ended)."""
        self.source = iter(())
        self.sequence = None
        self.buffer.clear()
        self.head = 0
        self.drop_returned()

    def _take_returned(self, size: int) -> tuple[int, list]:
        start, items = self.returned.popleft()
        if len(items) > size:
            self.returned.appendleft((start + size, items[size:]))
            items = items[:size]
        self.returned_n -= len(items)
        return start, items

    def _take_ahead(self, want: int) -> None:
        if self.sequence is not None:
            return  # nothing is read ahead: chunks are sliced from the list itself
        buf = self.buffer
        if not self.exhausted and len(buf) - self.head < want:
            # islice reads in C; next() per item cost ~1 µs per item on 10^5 no-ops.
            need = want - (len(buf) - self.head)
            before = len(buf)
            buf.extend(itertools.islice(self.source, need))
            if len(buf) - before < need:
                self.exhausted = True
                if self.total is None:
                    self.total = self.next_index + len(buf) - self.head

    def _take(self, size: int, ahead: int) -> list[Any]:
        seq = self.sequence
        if seq is not None:
            items = seq[self.next_index : min(self.next_index + size, self._end)]
            self.next_index += len(items)
            self.items_read = self.next_index
            if not items or self.next_index >= self._end:
                self.exhausted = True
            return items
        self._take_ahead(size + ahead)
        buf, head = self.buffer, self.head
        n = min(size, len(buf) - head)
        items = buf[head : head + n]
        head += n
        if head >= len(buf):
            buf.clear()
            head = 0
        elif head > len(buf) // 2:  # drop what was sent once it is most of the list: each item moves once at most
            del buf[:head]
            head = 0
        self.head = head
        self.next_index += n
        self.items_read = self.next_index + len(buf) - head
        return items
