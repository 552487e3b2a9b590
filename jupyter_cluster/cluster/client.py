"""The ``distributed.Client`` of a cluster a session holds: connected under a deadline, and let go when its scheduler goes.

Split out of :mod:`.session` (its ``start`` and ``connect`` call these).
"""

from __future__ import annotations

import sys
from typing import Any

from .. import config
from ..backends import StartedCluster, probe_scheduler
from ..errors import ClusterError


def connect_client(started: StartedCluster, name: str):
    from distributed import Client

    timeout = config.timeout_seconds("connect-timeout")
    kwargs: dict[str, Any] = {"timeout": timeout, "set_as_default": False}
    if started.security is not None:
        kwargs["security"] = started.security
    if started.cluster is None:  # attached by address: no cluster object vouches for the scheduler
        probe_scheduler(started.address, timeout, started.security)
    target = started.cluster if started.cluster is not None else started.address
    try:
        return Client(target, **kwargs)
    except (OSError, TimeoutError) as exc:
        raise ClusterError(
            f"no scheduler answered at {started.address} within {timeout:g} s; check the address and that the scheduler runs."
        ) from exc


def detach_when_lost(client: Any, name: str, address: str, target: str) -> None:
    """Let an attached client say in one line that its scheduler went away, and close.

    Dask's client reconnects for ``connect-timeout`` seconds when its connection
    to the scheduler drops, then logs an ERROR; a process that exits meanwhile
    prints the cancelled attempt's traceback.  A scheduler this process only
    attached to drops the connection when its owner stops it (it aborts its
    client connections), and retrying cannot bring it back.  So the client's
    reconnect step is replaced: the pending results fail, as in Dask's own
    step, with a reason that says what happened, one line says what to do, and
    the client closes (nothing retries).  The handle stays until ``%cluster
    stop`` or exit, and says the scheduler has gone if used (:meth:`ClusterHandle.scheduler_gone`).
    """
    message = (
        f"jupyter_cluster: the scheduler of cluster {name!r} at {address} closed the connection "
        f"(it stopped, or cannot be reached), so this process let go of it; "
        f"attach again with %cluster connect {target} (jupyter_cluster.connect in a script) once it runs."
    )

    async def detach() -> None:
        # What Dask's _reconnect does first (distributed 2026.8): fail the pending futures, and
        # drop the closed comm, so that _close sends nothing on it.
        for state in list(client.futures.values()):
            state.cancel(reason="scheduler-connection-lost", msg=message)
        client.futures.clear()
        client.scheduler_comm = None
        print(message, file=sys.stderr, flush=True)
        await client._close(fast=True)

    client._reconnect = detach
