"""``multiprocessing``'s channels on the cluster: ``Queue``, ``SimpleQueue``, ``JoinableQueue`` and ``Pipe``.

All are :class:`~jupyter_cluster.primitives.queue.Queue` underneath (a queue
kept by the scheduler), so every end works from the notebook, a task, a
``Process`` and a standard ``multiprocessing`` child alike.  As in
``multiprocessing``, ``close()`` only ends this process's use of a queue;
the queue itself stays on the scheduler until the cluster stops.
"""

from __future__ import annotations

import queue as _stdqueue
from typing import Any

from .queue import Queue as ClusterQueue


class Queue(ClusterQueue):
    """``multiprocessing.Queue`` on the cluster (``put``/``get`` with ``block``/``timeout``, ``close``, ``join_thread``)."""

    def __init__(self, maxsize: int = 0, *, ctx: Any = None, client: Any = None):
        super().__init__(maxsize, client=client)

    def close(self) -> None:
        """No more use of the queue by this process; other processes' copies still work."""
        self._closed = True

    def join_thread(self) -> None:
        """Accepted: items are on the scheduler once ``put`` returns (there is no feeder thread)."""
        if not self._closed:
            raise ValueError(f"Queue {self!r} not closed")

    def cancel_join_thread(self) -> None:
        """Accepted: there is no feeder thread to wait for."""

    def __repr__(self) -> str:
        return f"<jupyter_cluster.multiprocessing.Queue {self.name!r}>"


class JoinableQueue(Queue):
    """``multiprocessing.JoinableQueue``: a :class:`Queue` with ``task_done()`` and ``join()``."""

    def task_done(self) -> None:
        """Mark one item taken from the queue as processed."""
        if self._call("jc_queue_task_done") == "too-many":
            raise ValueError("task_done() called too many times")

    def join(self) -> None:
        """Wait until every item put has been marked done."""
        while not self._call("jc_queue_join", timeout=2.0):  # in slices, so a wait can be interrupted
            pass


class SimpleQueue:
    """``multiprocessing.SimpleQueue``: ``put``, ``get``, ``empty``, ``close``."""

    def __init__(self, *, ctx: Any = None, client: Any = None):
        self._queue = Queue(client=client)

    def put(self, obj: Any) -> None:
        self._queue.put(obj)

    def get(self) -> Any:
        return self._queue.get()

    def empty(self) -> bool:
        return self._queue.empty()

    def close(self) -> None:
        self._queue.close()


class _EndOfFile:
    """What a closed writing end leaves in its channel: the reader's next ``recv`` raises EOFError."""

    def __reduce__(self):
        return (_EndOfFile, ())


_NOTHING = object()


class Connection:
    """One end of a :func:`Pipe` (``multiprocessing.connection.Connection``'s methods).

    Objects sent travel pickled through the scheduler; ``fileno()`` and
    waiting on several connections with ``multiprocessing.connection.wait``
    are not available.
    """

    def __init__(self, inbox: Queue | None, outbox: Queue | None):
        self._inbox, self._outbox = inbox, outbox
        self._peeked: Any = _NOTHING
        self._closed = False

    def __getstate__(self) -> dict[str, Any]:
        if self._peeked is not _NOTHING:  # an item poll() took must not be lost with this copy
            raise RuntimeError("a Connection that has an item waiting (after poll()) cannot be sent; recv() it first")
        return {"_inbox": self._inbox, "_outbox": self._outbox, "_closed": self._closed}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._peeked = _NOTHING

    @property
    def readable(self) -> bool:
        return self._inbox is not None

    @property
    def writable(self) -> bool:
        return self._outbox is not None

    @property
    def closed(self) -> bool:
        return self._closed

    def _check(self, reading: bool) -> Queue:
        if self._closed:
            raise OSError("handle is closed")
        end = self._inbox if reading else self._outbox
        if end is None:
            raise OSError(f"connection is {'write' if reading else 'read'}-only")
        return end

    def send(self, obj: Any) -> None:
        """Send a picklable object to the other end."""
        self._check(False).put(obj)

    def recv(self) -> Any:
        """The next object sent by the other end; ``EOFError`` once that end is closed and nothing is left."""
        inbox = self._check(True)
        if self._peeked is not _NOTHING:
            item, self._peeked = self._peeked, _NOTHING
        else:
            item = inbox.get()
        if isinstance(item, _EndOfFile):
            self._peeked = item  # every later recv raises too
            raise EOFError
        return item

    def poll(self, timeout: float | None = 0.0) -> bool:
        """Whether there is something to ``recv`` (waiting up to ``timeout`` seconds; ``None``: forever)."""
        inbox = self._check(True)
        if self._peeked is not _NOTHING:
            return True
        try:
            self._peeked = inbox.get(timeout=timeout) if timeout is None or timeout > 0 else inbox.get_nowait()
        except _stdqueue.Empty:
            return False
        return True

    def send_bytes(self, buf: Any, offset: int = 0, size: int | None = None) -> None:
        """Send bytes (a slice of a bytes-like object)."""
        view = memoryview(buf).cast("B")
        if offset < 0 or offset > len(view):
            raise ValueError("offset is negative or too large")
        if size is None:
            size = len(view) - offset
        if size < 0 or offset + size > len(view):
            raise ValueError("size is negative or buffer too small")
        self.send(bytes(view[offset : offset + size]))

    def recv_bytes(self, maxlength: int | None = None) -> bytes:
        """The next message sent with ``send_bytes``."""
        if maxlength is not None and maxlength < 0:
            raise ValueError("negative maxlength")
        data = self.recv()
        if maxlength is not None and len(data) > maxlength:
            self.close()
            raise OSError("bad message length")
        return data

    def recv_bytes_into(self, buf: Any, offset: int = 0) -> int:
        """Read the next message into ``buf`` at ``offset``; returns its length."""
        from multiprocessing import BufferTooShort

        data = self.recv()
        view = memoryview(buf).cast("B")
        if offset < 0 or offset > len(view):
            raise ValueError("offset out of bounds")
        if len(data) > len(view) - offset:
            raise BufferTooShort(data)
        view[offset : offset + len(data)] = data
        return len(data)

    def close(self) -> None:
        """Close this copy of this end.

        Unlike an OS pipe, this does not make the other end's ``recv`` raise
        ``EOFError``: copies of an end live in many processes (the common
        ``child_conn.close()`` in the parent after ``start()`` must not end the
        child's), and the cluster cannot count them.  Send a sentinel instead.
        """
        self._closed = True

    def fileno(self) -> int:
        raise OSError("a cluster Pipe has no file descriptor (it travels through the scheduler)")

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<jupyter_cluster.multiprocessing.Connection readable={self.readable} writable={self.writable}>"


def Pipe(duplex: bool = True, *, client: Any = None) -> tuple[Connection, Connection]:  # noqa: N802 (multiprocessing's name)
    """Two connected ends: ``(conn1, conn2)``; with ``duplex=False`` conn1 only receives and conn2 only sends."""
    a_to_b = Queue(client=client)
    if not duplex:
        return Connection(a_to_b, None), Connection(None, a_to_b)
    b_to_a = Queue(client=client)
    return Connection(b_to_a, a_to_b), Connection(a_to_b, b_to_a)
