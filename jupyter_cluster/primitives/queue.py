"""``jupyter_cluster.Queue``: a FIFO queue shared by the notebook and its tasks.

The queue lives in the Dask scheduler, so any client or task of the cluster can
put and get, and it survives the loss of any worker.  Items are pickled with
cloudpickle here and unpickled by the reader, so anything picklable goes in
(tuples stay tuples), but every item travels through the scheduler: keep items
small (a few MB at most).

The scheduler side is a small scheduler plugin (:mod:`.dqueue_store`) rather
than Dask's own queue extension, because that one logs an error with a
traceback on the scheduler every time a ``get`` or ``put`` times out, which is
the normal way to poll.
"""

from __future__ import annotations

import os
import queue as _stdqueue
import time
import uuid
from typing import TYPE_CHECKING, Any

import cloudpickle

from ..errors import ClusterError
from .connect import client_for, scheduler_address

if TYPE_CHECKING:  # distributed is imported when a queue is first used, not with this module
    from distributed import Client

# A blocking get is split into slices: if the caller is interrupted, at most one
# slice's worth of scheduler-side waiting is left behind (an item it takes then
# is lost), instead of a wait that lasts forever.
_SLICE = 2.0


class Queue:
    """A FIFO queue on the cluster, usable from the notebook and from tasks.

    Same methods as :class:`queue.Queue` / :class:`multiprocessing.Queue`:
    ``put``, ``get`` (with ``block`` and ``timeout``, raising
    :class:`queue.Full` / :class:`queue.Empty`), ``put_nowait``,
    ``get_nowait``, ``qsize``, ``empty``, ``full``.

    Parameters
    ----------
    maxsize : int
        Most items held at once; ``0`` (default) means unbounded.  A ``put`` to
        a full queue waits (or raises :class:`queue.Full`).
    name : str, optional
        Name on the scheduler.  Two ``Queue`` objects with the same name on the
        same cluster are the same queue.
    client : distributed.Client, optional
        Defaults to the current cluster's client (starting the default local
        cluster if there is none), or inside a task to the worker's client.

    Notes
    -----
    Pass the queue to tasks as an argument (or let a ``%%parallel`` cell
    capture it); it pickles to its name.  The queue is removed from the
    scheduler by :meth:`close` on the object that created it.  An item travels
    through the scheduler, so put small items, or ``client.scatter`` big data
    and put what you need to find it.

    Examples
    --------
    >>> import jupyter_cluster as jc
    >>> q = jc.Queue()                                    # doctest: +SKIP
    >>> def work(i, q):
    ...     q.put((i, i * i))
    >>> with jc.Pool() as pool:                           # doctest: +SKIP
    ...     pool.starmap(work, [(i, q) for i in range(3)])
    ...     sorted(q.get(timeout=5) for _ in range(3))
    [(0, 0), (1, 1), (2, 4)]
    """

    def __init__(self, maxsize: int = 0, *, name: str | None = None, client: Client | None = None):
        if not isinstance(maxsize, int) or isinstance(maxsize, bool):
            raise TypeError(f"maxsize must be an int, not {type(maxsize).__name__}.")
        self.name = name or f"queue-{uuid.uuid4().hex}"
        self._client: Client | None = _client_of(client)
        self._address = scheduler_address(self._client)
        self._pid = os.getpid()
        self._closed = False
        self._owner = True
        from .queue_store import PLUGIN, QueueStore  # lazy: tasks that only use a queue never load the plugin

        self._client.register_plugin(QueueStore(), name=PLUGIN)
        # An existing queue of that name keeps its own maxsize.
        self.maxsize = self._call("jc_queue_create", maxsize=max(maxsize, 0))

    @classmethod
    def _attach(cls, name: str, maxsize: int, address: str | None = None) -> Queue:
        self = cls.__new__(cls)
        self.name, self.maxsize = name, maxsize
        self._address = address
        self._pid = os.getpid()
        self._client = None
        self._closed = False
        self._owner = False
        return self

    def __reduce__(self):
        # The scheduler's address travels too: a process that holds no cluster (a standard
        # multiprocessing child of the notebook) connects to it rather than starting a cluster.
        return (type(self)._attach, (self.name, self.maxsize, self._address))

    def __repr__(self) -> str:
        size = "unbounded" if not self.maxsize else f"maxsize={self.maxsize}"
        return f"<jupyter_cluster.Queue {self.name!r} {size}>"

    # -- plumbing ----------------------------------------------------------
    @property
    def client(self) -> Client:
        """The ``distributed.Client`` this queue talks through."""
        if self._client is None or self._pid != os.getpid():
            # A forked child (multiprocessing's fork start method copies the object, client and all,
            # without pickling it) has no event loop for the parent's client: it connects its own.
            self._client = client_for(self._address)
            self._pid = os.getpid()
        return self._client

    def _call(self, route: str, **kwargs: Any) -> Any:
        if self._closed:
            raise ValueError(f"Queue {self.name!r} is closed")
        client = self.client
        rpc = getattr(client.scheduler, route)

        async def call():
            return await rpc(name=self.name, **kwargs)

        try:
            return client.sync(call)
        except OSError as exc:
            raise ClusterError(
                f"the scheduler holding queue {self.name!r} cannot be reached ({exc or type(exc).__name__}); is the cluster still running?"
            ) from exc

    def _missing(self) -> ClusterError:
        return ClusterError(
            f"queue {self.name!r} no longer exists on the scheduler (it was closed); create a new jupyter_cluster.Queue."
        )

    # -- queue API -----------------------------------------------------------
    def put(self, obj: Any, block: bool = True, timeout: float | None = None) -> None:
        """Put ``obj`` at the end of the queue.

        Parameters
        ----------
        obj : object
            Any picklable object.
        block, timeout
            As :meth:`queue.Queue.put`: with ``block=False``, or after
            ``timeout`` seconds, a full queue raises :class:`queue.Full`.
        """
        data = cloudpickle.dumps(obj)
        status = self._call("jc_queue_put", data=data, timeout=_wait_seconds(block, timeout))
        if status == "full":
            raise _stdqueue.Full
        if status == "missing":
            raise self._missing()

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """Remove and return the first item.

        Parameters
        ----------
        block, timeout
            As :meth:`queue.Queue.get`: with ``block=False``, or after
            ``timeout`` seconds, an empty queue raises :class:`queue.Empty`.
        """
        wait = _wait_seconds(block, timeout)
        deadline = None if wait is None else time.monotonic() + wait
        while True:
            remaining = _SLICE if deadline is None else max(0.0, min(_SLICE, deadline - time.monotonic()))
            reply = self._call("jc_queue_get", timeout=remaining)
            if reply["status"] == "ok":
                return cloudpickle.loads(reply["data"])
            if reply["status"] == "missing":
                raise self._missing()
            if deadline is not None and time.monotonic() >= deadline:
                raise _stdqueue.Empty

    def put_nowait(self, obj: Any) -> None:
        """``put(obj, block=False)``."""
        self.put(obj, block=False)

    def get_nowait(self) -> Any:
        """``get(block=False)``."""
        return self.get(block=False)

    def qsize(self) -> int:
        """The number of items in the queue now."""
        n = self._call("jc_queue_qsize")
        if n < 0:
            raise self._missing()
        return int(n)

    def empty(self) -> bool:
        """Whether the queue holds no item now."""
        return self.qsize() == 0

    def full(self) -> bool:
        """Whether a ``put`` would have to wait now."""
        return bool(self.maxsize) and self.qsize() >= self.maxsize

    def close(self) -> None:
        """Stop using the queue; on the object that created it, delete it from the scheduler.

        Copies held by tasks then raise :class:`ClusterError`; closing twice is
        harmless.
        """
        if self._closed:
            return
        if self._owner:
            try:
                self._call("jc_queue_release")
            except ClusterError:  # the cluster is gone, and the queue with it
                pass
        self._closed = True

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _wait_seconds(block: bool, timeout: float | None) -> float | None:
    if not block:
        return 0.0
    if timeout is None:
        return None
    if timeout < 0:
        raise ValueError("'timeout' must be a non-negative number")
    return float(timeout)


def _client_of(cluster: Any = None) -> Client:
    from ..cluster import session  # not at import: tasks that use this module need no notebook side

    return session.client_of(cluster)
