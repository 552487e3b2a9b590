"""Telling a scheduler that went away from one that is slow, and Dask's errors in the package's words.

Used by the map engine (:mod:`.port`) and ``Pool``.
"""

from __future__ import annotations

import socket
import time
from urllib.parse import urlsplit

from distributed import Client

from ..errors import ClusterError, WorkerLostError
from .cluster import is_killed_worker, scheduler_address

# -- telling a scheduler that went away from one that is slow ------------------------------
# Dask's futures stay pending while a client tries to reconnect, which looks
# like a hang to the user.  The map engine and ``Pool`` both ask a
# SchedulerWatch whether to give up.  A scheduler of a big cluster can be too
# busy to answer its clients for many seconds (a 256-worker cluster's saturated
# scheduler made a map fail after 24 s that then ran in 8.2 s): a client that
# lost its connection gives up only once the scheduler's address refuses
# connections (its process is gone, or its host unreachable), or after
# SLOW_SCHEDULER_SECONDS however it looks.

#: How long the client may be disconnected from the scheduler before the watch looks whether it is gone, in seconds.
DISCONNECT_GRACE_SECONDS = 2.0
#: How long a disconnected client waits for a scheduler whose address still accepts connections (alive but
#: busy), in seconds.
SLOW_SCHEDULER_SECONDS = 120.0
#: How long a look at the scheduler's address may take (a host that does not answer is taken as gone), in seconds.
PROBE_TIMEOUT_SECONDS = 1.0
#: A disconnected client looks at its scheduler's address at most this often, in seconds.
PROBE_EVERY_SECONDS = 1.0


def scheduler_accepts(address: str, timeout: float = PROBE_TIMEOUT_SECONDS) -> bool:
    """Whether something listens at a scheduler's ``tcp://`` or ``tls://`` address (a TCP connection only).

    The kernel accepts a connection on a listening socket while the process
    behind it is busy, so this tells a slow scheduler (True) from one whose
    process is gone or whose host does not answer (False).  False for
    addresses that are not host and port (``inproc://``: the scheduler
    lives in this process and cannot be slow to the client without being
    slow to everything).
    """
    try:
        parts = urlsplit(address)
        host, port = parts.hostname, parts.port
    except ValueError:
        return False
    if parts.scheme not in ("tcp", "tls", "ws", "wss") or not host or not port:
        return False
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


class SchedulerWatch:
    """Follows one client's connection to its scheduler, telling a slow scheduler from a lost one.

    Parameters
    ----------
    client : distributed.Client
    grace : float
        Seconds a reconnecting client is given before :meth:`lost` looks at
        the scheduler's address.
    patience : float
        Seconds a reconnecting client is given while the scheduler's address
        still accepts connections.
    """

    def __init__(
        self, client: Client, grace: float = DISCONNECT_GRACE_SECONDS, patience: float = SLOW_SCHEDULER_SECONDS
    ):
        self.client = client
        self.grace = grace
        self.patience = patience
        self._since: float | None = None
        self._next_probe = 0.0
        self._alive = True

    def reset(self) -> None:
        """Forget an earlier disconnection (nothing is waiting on the scheduler)."""
        self._since = None

    def lost(self) -> bool:
        """Whether the scheduler is gone for good.

        Closed; or disconnected longer than the grace period while its
        address refuses connections; or disconnected longer than the
        patience however it looks.  A connected client's scheduler is never
        lost here, however slowly it answers.
        """
        status = getattr(self.client, "status", "running")
        if status == "running":
            self._since = None
            return False
        if status in ("closed", "closing"):
            return True
        now = time.monotonic()
        if self._since is None:
            self._since = now
            self._next_probe = 0.0
        away = now - self._since
        if away <= self.grace:
            return False
        if away > self.patience:
            return True
        if now >= self._next_probe:
            self._alive = scheduler_accepts(scheduler_address(self.client))
            self._next_probe = time.monotonic() + PROBE_EVERY_SECONDS
        return not self._alive


def scheduler_lost_error(client: Client, lost: str, redo: str, cluster: str | None = None) -> ClusterError:
    """The error for work whose scheduler stopped answering (once :meth:`SchedulerWatch.lost` says so).

    One wording for the map and ``Pool``.  ``lost`` says what became of the
    work (``"this call's result is lost"``), ``redo`` what to make anew once
    a cluster is back (``"a new Pool"``); ``cluster`` names the cluster when
    it has a name (a map given a plain client knows only the address).
    """
    address = scheduler_address(client)
    where = f"at {address}" if cluster is None or cluster == address else f"of cluster {cluster!r} ({address})"
    return ClusterError(
        f"the scheduler {where} stopped answering: {lost}; start or connect a cluster "
        f"(%cluster start / %cluster connect) and {redo}."
    )


def translate_error(exc: BaseException, what: str, cluster: str) -> BaseException:
    """Dask's ways of saying "the cluster failed" in our words; a task's own error passes unchanged.

    ``what`` names the call (``"apply_async(f)"``), ``cluster`` the cluster.
    """
    from distributed.client import FutureCancelledError

    if is_killed_worker(exc):
        lost = WorkerLostError(
            f"{what} killed the worker process running it every time it was tried, so it was given up; "
            "look for what in the call crashes the process (memory, a native library, os._exit)."
        )
        lost.__cause__ = exc
        return lost
    if isinstance(exc, (FutureCancelledError, OSError)) and not isinstance(exc, TimeoutError):
        gone = ClusterError(
            f"{what} was lost because the connection to cluster {cluster!r} "
            "broke (was the cluster stopped?); start or connect a cluster and a new Pool."
        )
        gone.__cause__ = exc
        return gone
    return exc
