"""Telling a scheduler that went away from one that blinked.

Dask's futures stay pending while a client tries to reconnect, which looks
like a hang to the user.  The map engine and ``Pool`` both ask a
:class:`SchedulerWatch` whether to give up.
"""

from __future__ import annotations

import time
from typing import Any

#: How long the client may be disconnected from the scheduler before work fails, in seconds.
DISCONNECT_GRACE_SECONDS = 2.0


class SchedulerWatch:
    """Follows one client's connection to its scheduler.

    Parameters
    ----------
    client : distributed.Client
    grace : float
        Seconds a reconnecting client is given before :meth:`lost` says so.
    """

    def __init__(self, client: Any, grace: float = DISCONNECT_GRACE_SECONDS):
        self.client = client
        self.grace = grace
        self._since: float | None = None

    def reset(self) -> None:
        """Forget an earlier disconnection (nothing is waiting on the scheduler)."""
        self._since = None

    def lost(self) -> bool:
        """Whether the scheduler is gone for good: closed, or away longer than the grace period."""
        status = getattr(self.client, "status", "running")
        if status == "running":
            self._since = None
            return False
        now = time.monotonic()
        if self._since is None:
            self._since = now
        return status in ("closed", "closing") or now - self._since > self.grace
