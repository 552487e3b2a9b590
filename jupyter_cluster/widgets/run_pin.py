"""Which run a live ``show_runs()`` shows: the one it was made for, not every later map of the kernel.

``jc.show_runs()`` after a sweep cell shows that sweep; made before any run,
it shows the first run that starts after it.  A later, unrelated
``%%parallel m in range(8)`` does not add its rows (30 rows became 38).
``show_runs(every=True)``, ``notebook=`` or ``run=`` widen or choose it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any


def _started(r: Mapping[str, Any]) -> float:
    v = r.get("started")
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0


class RunPin:
    """The run a live table follows: the newest when it was made, else the first to start after.

    Parameters
    ----------
    records : iterable of dict
        The kernel's run records when the table is made (:func:`jupyter_cluster.tracking.runs.group_runs`).
    now : float, optional
        When it was made (``time.time()``).
    """

    def __init__(self, records: Iterable[Mapping[str, Any]], now: float | None = None):
        self.made = time.time() if now is None else now
        newest = max(records, key=_started, default=None)
        self.run: str | None = str(newest["run"]) if newest is not None and newest.get("run") else None

    def resolve(self, records: Iterable[Mapping[str, Any]]) -> str | None:
        """The run followed: once one started after the table was made, that one for good."""
        if self.run is None:
            later = [r for r in records if r.get("run") and _started(r) >= self.made - 1.0]
            if later:
                self.run = str(min(later, key=_started)["run"])
        return self.run
