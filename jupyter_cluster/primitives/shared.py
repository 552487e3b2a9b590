"""The client side of an object kept by the scheduler plugin :mod:`.shared_store`.

An object pickles to its kind, name and scheduler address (see
:mod:`.connect`), so a copy anywhere on the cluster, or in a standard
``multiprocessing`` child, is the same object.
"""

from __future__ import annotations

import os
import threading
import uuid
from typing import Any

from ..errors import ClusterError
from .connect import client_for, scheduler_address

_registered: set[tuple[int, str]] = set()
_registered_lock = threading.Lock()


class Shared:
    """Base of the shared objects: a name on the cluster's scheduler and the calls to it."""

    _prefix = "shared"

    def _bind(self, client: Any = None, name: str | None = None) -> None:
        if client is None:
            from ..cluster import session  # not at import: a task needs no notebook side

            client = session.client_of()
        self._name = name or f"{self._prefix}-{uuid.uuid4().hex}"
        self._client = client
        self._address = scheduler_address(client)
        self._pid = os.getpid()
        _register(client)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._pid = os.getpid()

    @property
    def _live_client(self) -> Any:
        if self._client is None or self._pid != os.getpid():  # unpickled, or copied by a fork
            self._client = client_for(self._address)
            self._pid = os.getpid()
        return self._client

    def _call(self, route: str, **kwargs: Any) -> Any:
        client = self._live_client
        rpc = getattr(client.scheduler, f"jc_shared_{route}")

        async def call() -> Any:
            return await rpc(**kwargs)

        try:
            return client.sync(call)
        except OSError as exc:
            raise ClusterError(
                f"the scheduler holding {self!r} cannot be reached ({exc or type(exc).__name__}); is the cluster still running?"
            ) from exc

    def _missing(self) -> ClusterError:
        return ClusterError(f"{self!r} no longer exists on the scheduler (its manager was shut down).")

    def __repr__(self) -> str:
        return f"<jupyter_cluster.multiprocessing.{type(self).__name__} {self._name}>"


def _register(client: Any) -> None:
    from .shared_store import PLUGIN, SharedStore  # lazy: loads distributed

    key = (os.getpid(), scheduler_address(client) or "")
    with _registered_lock:
        if key in _registered:
            return
        client.register_plugin(SharedStore(), name=PLUGIN)
        _registered.add(key)


def owner_token() -> str:
    """Who holds a lock: this process and thread (a lock is owned per thread, as in multiprocessing)."""
    import socket

    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"
