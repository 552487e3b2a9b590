"""``jupyter_cluster.actor``: an object that lives on one worker and keeps its state.

A thin layer over Dask actors.  The object is built once on a worker; every
method call runs there, one call at a time, on the same instance, so state
(an RL environment, a learner's weights, a replay buffer) stays put between
calls and is never copied back.  What this layer adds to Dask's ``Actor``:
the current cluster is used without passing a client, method calls always
return a future (also for calls made from inside an actor), a lost worker
raises one clear :class:`ClusterError` instead of a connection error, and the
handle can be closed.
"""

from __future__ import annotations

import time
from typing import Any, Generic, TypeVar

from ..errors import ClusterError

T = TypeVar("T")


#: How often a waiting :meth:`ActorCall.result` looks whether the actor's worker was lost, in seconds.
LOST_CHECK_SECONDS = 0.5


class ActorCall(Generic[T]):
    """The future of one method call on an actor.

    ``result(timeout=None)`` waits for and returns the method's return value,
    or re-raises the exception the method raised (same type).  Awaitable in
    async code.
    """

    __slots__ = ("_future", "_handle", "_method")

    def __init__(self, future: Any, handle: ActorHandle, method: str):
        self._future = future
        self._handle = handle
        self._method = method

    def done(self) -> bool:
        """Whether the call has finished (successfully or not)."""
        return self._future.done()

    def result(self, timeout: float | None = None) -> T:
        """The method's return value.

        Parameters
        ----------
        timeout : float, optional
            Seconds to wait; then :class:`TimeoutError` is raised (the call
            itself goes on).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            # In slices: a call to a worker that was killed can wait out Dask's connect retries (30 s),
            # while the scheduler has marked the actor's task as failed within a fraction of a second.
            left = (
                LOST_CHECK_SECONDS if deadline is None else max(min(LOST_CHECK_SECONDS, deadline - time.monotonic()), 0)
            )
            try:
                return self._future.result(timeout=left)
            except TimeoutError:
                if self._handle._gone():
                    raise self._handle._lost(self._method) from None
                if deadline is not None and time.monotonic() >= deadline:
                    raise
            except OSError as exc:
                raise self._handle._lost(self._method) from exc

    def __await__(self):
        return self._future.__await__()

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"<ActorCall {self._handle._cls.__name__}.{self._method}() {state}>"


class ActorHandle:
    """A handle on an object living on a worker (see :func:`actor`).

    * ``handle.method(*args, **kwargs)`` runs the method on the worker and
      returns an :class:`ActorCall` at once; ``.result()`` gives the value.
      Calls run one at a time, in the order they arrive.
    * ``handle.attribute`` (a non-callable attribute) returns its current value.
    * The handle pickles, so it can be passed to tasks (``Pool.map``,
      ``%%parallel``) which then call the same instance.

    Attributes
    ----------
    worker : str
        Address of the worker holding the object.
    """

    def __init__(self, dask_actor: Any, cls: type, future: Any = None, client: Any = None):
        if client is not None:
            _bind(dask_actor, client)
        object.__setattr__(self, "_actor", dask_actor)
        object.__setattr__(self, "_cls", cls)
        # Holding the creating future keeps the object alive on its worker.
        object.__setattr__(self, "_future", future)
        object.__setattr__(self, "_closed", False)

    @property
    def worker(self) -> str:
        return self._actor._address

    def _gone(self) -> bool:
        """Whether the scheduler says the actor's worker was lost (its task failed or was released)."""
        return self._future is not None and self._future.status in ("error", "lost", "cancelled")

    def _lost(self, what: str) -> ClusterError:
        return ClusterError(
            f"the worker holding actor {self._cls.__name__} ({self.worker}) was lost, and the object's state with it; "
            f"create a new one with jupyter_cluster.actor({self._cls.__name__}, ...)."
        )

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if self._closed:
            raise ValueError(f"actor {self._cls.__name__} is closed")
        _bind(self._actor)
        try:
            attr = getattr(self._cls, name)
        except AttributeError:
            attr = None  # an instance attribute, set in __init__: read it remotely
        if attr is not None and callable(attr):

            def call(*args: Any, **kwargs: Any) -> ActorCall:
                try:
                    fut = getattr(self._actor, name)(*args, **kwargs)
                except RuntimeError as exc:  # Dask: "Worker holding Actor was lost"
                    if "lost" not in str(exc):
                        raise
                    raise self._lost(name) from exc
                if not hasattr(fut, "result"):  # a coroutine method called from inside an actor
                    return fut
                return ActorCall(fut, self, name)

            call.__name__ = name
            call.__doc__ = getattr(attr, "__doc__", None)
            return call
        try:
            return _read_attribute(self._actor, name)
        except RuntimeError as exc:  # Dask: "Worker holding Actor was lost"
            if "lost" not in str(exc):
                raise
            raise self._lost(name) from exc
        except TimeoutError:
            raise
        except OSError as exc:
            raise self._lost(name) from exc

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(
            f"attributes of actor {self._cls.__name__} cannot be set from outside; add a method that sets {name!r} and call it."
        )

    def __dir__(self):
        return sorted(set(dir(type(self))) | {a for a in dir(self._cls) if not a.startswith("_")})

    def __reduce__(self):
        return (ActorHandle, (self._actor, self._cls))

    def __repr__(self) -> str:
        return f"<jupyter_cluster actor {self._cls.__name__} on {self.worker}>"

    def close(self) -> None:
        """Let go of the object: once no handle created it, the worker drops it."""
        if self._closed:
            return
        object.__setattr__(self, "_closed", True)
        if self._future is not None:
            self._future.release()

    def __enter__(self) -> ActorHandle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _read_attribute(dask_actor: Any, name: str) -> Any:
    """Read an attribute of the remote object, including ones set in ``__init__``.

    Dask's proxy only reads attributes that exist on the class, so the
    worker's ``actor_attribute`` route is called directly here.
    """
    fut = dask_actor._future
    if fut is not None and fut.status not in ("finished", "pending"):
        raise RuntimeError(f"Worker holding Actor was lost.  Status: {fut.status}")

    async def read():
        reply = await dask_actor._worker_rpc.actor_attribute(attribute=name, actor=dask_actor.key)
        if reply["status"] == "OK":
            return reply["result"]
        raise reply["exception"]

    return dask_actor._sync(read)


def _bind(dask_actor: Any, client: Any = None) -> None:
    """Give a Dask actor proxy a client to talk through.

    Dask's proxy looks for a worker or the *default* client, but our sessions
    do not make their clients the default (several clusters can be held at
    once), so the proxy is bound explicitly.
    """
    if dask_actor._client is not None or dask_actor._worker is not None:
        return
    dask_actor._try_bind_worker_client()  # inside a task this finds the worker
    if dask_actor._worker is None and dask_actor._client is None:
        with _client_of(client).as_current():
            dask_actor._try_bind_worker_client()


def create(
    cls: type,
    args: tuple = (),
    kwargs: dict | None = None,
    *,
    client: Any = None,
    workers: str | list[str] | None = None,
) -> ActorHandle:
    """Build ``cls(*args, **kwargs)`` on a worker and return a handle on it.

    Like :func:`actor`, with placement and client options.

    Parameters
    ----------
    cls : type
        The class to instantiate (a notebook-defined class is fine).
    args, kwargs
        Arguments for ``cls``.
    client : distributed.Client, optional
        Defaults to the current cluster's (starting the default one if none),
        or the worker's inside a task.
    workers : str or list of str, optional
        Worker address(es) allowed to hold the object.
    """
    if not isinstance(cls, type):
        raise TypeError(
            f"actor needs a class, not {type(cls).__name__}; pass the class itself, e.g. actor(Env, 'CartPole-v1')."
        )
    client = _client_of(client)
    future = client.submit(cls, *args, actor=True, pure=False, workers=workers, **(kwargs or {}))
    dask_actor = future.result()
    return ActorHandle(dask_actor, cls, future, client=client)


def actor(cls: type, /, *args: Any, **kwargs: Any) -> ActorHandle:
    """Build ``cls(*args, **kwargs)`` on a worker of the current cluster and return a handle.

    The object stays on that worker.  Method calls return an
    :class:`ActorCall` future at once (call ``.result()`` for the value);
    reading a plain attribute returns its value.  Calls run one at a time on
    the worker, in arrival order, so the object needs no locking.

    Parameters
    ----------
    cls : type
        The class to instantiate.
    *args, **kwargs
        Its arguments (all keyword arguments go to ``cls``; use
        :func:`jupyter_cluster.primitives.actors.create` to choose a worker or client).

    Returns
    -------
    ActorHandle

    Notes
    -----
    The object's state lives only in that worker's memory.  If the worker
    dies, the state is gone and calls raise :class:`ClusterError`; keep what
    you cannot lose elsewhere (a checkpoint, the notebook).

    Examples
    --------
    >>> class Counter:
    ...     def __init__(self, start=0):
    ...         self.n = start
    ...     def add(self, k=1):
    ...         self.n += k
    ...         return self.n
    >>> c = jupyter_cluster.actor(Counter, 10)      # doctest: +SKIP
    >>> c.add(5).result()                           # doctest: +SKIP
    15
    >>> c.n                                         # doctest: +SKIP
    15
    """
    return create(cls, args, kwargs)


def _client_of(cluster: Any = None) -> Any:
    from ..cluster import session  # not at import: tasks that use this module need no notebook side

    return session.client_of(cluster)
