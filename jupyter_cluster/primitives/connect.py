"""The client a shared object talks through, wherever it was unpickled.

A ``Queue``, ``Pipe`` end, lock or manager proxy pickles to its name and its
scheduler's address.  Unpickled in a task (a ``Pool`` item, a ``Process``, an
actor, a ``%%parallel`` item) it uses the worker's client; in the process that
holds the cluster, that cluster's client; anywhere else (a standard
``multiprocessing`` child of the notebook, forked or spawned) it connects its
own client to the address, once per process, or raises one sentence at once.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from ..errors import ClusterError

#: Seconds a process without a cluster waits to connect to the scheduler of an object it was handed.
CONNECT_SECONDS = 10.0

_clients: dict[tuple[int, str], Any] = {}
_clients_lock = threading.Lock()


def client_for(address: str | None) -> Any:
    """The ``distributed.Client`` to reach the scheduler at ``address`` from this process.

    ``None`` (an object made before its address was known): the current
    cluster's, as :func:`jupyter_cluster.cluster.session.client_of` picks it.
    """
    from ..cluster import session  # not at import: tasks that use a primitive need no notebook side

    if address is None or session._in_task():
        return session.client_of()
    if os.getpid() == session._PID:  # not a forked child: the clusters this process holds are live
        for handle in session.handles():
            client = handle.client
            if getattr(client.scheduler, "address", None) == address and not handle.closed:
                return client
    return _own_client(address, _security_of(session, address))


def _security_of(session: Any, address: str) -> Any:
    """The TLS credentials for ``address``: an inherited handle's (a forked child), else this user's saved ones."""
    for handle in session.handles():
        if handle.address == address and getattr(handle, "security", None) is not None:
            return handle.security
    if address.startswith("tls://"):
        return session._security_for_address(address)
    return None


def scheduler_address(client: Any) -> str | None:
    """The address a shared object records, so that other processes can find its scheduler."""
    return getattr(getattr(client, "scheduler", None), "address", None)


def _own_client(address: str, security: Any) -> Any:
    key = (os.getpid(), address)
    with _clients_lock:
        client = _clients.get(key)
        if client is not None and client.status == "running":
            return client
        from distributed import Client

        try:
            client = Client(address, timeout=CONNECT_SECONDS, security=security, set_as_default=False)
        except (OSError, TimeoutError) as exc:
            raise ClusterError(
                f"this process (pid {os.getpid()}) was handed an object of the cluster at {address}, "
                f"which it cannot reach ({exc or type(exc).__name__}); is the cluster still running?"
            ) from exc
        _clients[key] = client
        return client
