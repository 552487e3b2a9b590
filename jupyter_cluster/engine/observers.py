"""Who hears about a map: observer factories (progress bars, runs, telemetry), and :func:`last_job`.

A front end registers ``factory(job, progress) -> observer | None`` with
:func:`add_observer_factory`; every new map (:class:`.job.MapJob`) asks each
factory for an observer and calls its ``job_started``, ``job_progress`` (at
most every :data:`PROGRESS_INTERVAL` seconds) and ``job_finished``
(:class:`Observers`).  A broken observer never breaks a map: its failure is
logged.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("jupyter_cluster.engine.job")

#: Observers hear about progress at most this often, in seconds.
PROGRESS_INTERVAL = 0.1

_observer_factories: list[Callable] = []
# The most recently started map: always known weakly (a running map lives as long as whoever drives
# it; an abandoned imap must be collected, which cancels it).  Held strongly once it ended without
# finishing (an interrupt or a failure: its partial results are documented to stay reachable), or
# finished holding none of the caller's values.  A finished map that still holds them (a Pool.map's,
# a run_on_workers job's) lives only as long as its caller keeps it.
_last_job: Any = None
_last_job_ref: weakref.ReferenceType | None = None


def add_observer_factory(factory: Callable) -> None:
    """Register ``factory(job, progress) -> observer | None``, called for every new map.

    The observer may define ``job_started(job)``, ``job_progress(job)`` (called
    at most every :data:`PROGRESS_INTERVAL` seconds) and ``job_finished(job)``.
    ``progress`` is the user's ``progress`` argument (None = automatic).
    """
    if factory not in _observer_factories:
        _observer_factories.append(factory)


def remove_observer_factory(factory: Callable) -> None:
    """Undo :func:`add_observer_factory`."""
    if factory in _observer_factories:
        _observer_factories.remove(factory)


def last_job() -> Any:
    """The most recently started map in this process (keeps its results after an interrupt).

    A map that finished is kept for its record (counts, timings, outputs,
    failures' text) but not for its values: :func:`map` hands its results to
    its caller and keeps none, and a finished map whose caller still owns its
    results (``Pool.map``, :func:`.mapping.run_on_workers`) is returned only while that
    caller keeps the job; None after that.  So is a running map (an
    :func:`imap` its caller dropped is collected, which cancels it).
    """
    if _last_job is not None:
        return _last_job
    return _last_job_ref() if _last_job_ref is not None else None


def started(job: Any) -> None:
    """``job`` is the newest map: :func:`last_job` returns it (weakly held while it runs)."""
    global _last_job, _last_job_ref
    _last_job, _last_job_ref = None, weakref.ref(job)


def settle(job: Any, keep: bool) -> None:
    """Hold ``job`` strongly as :func:`last_job` when ``keep``, weakly otherwise; nothing if a newer map started."""
    global _last_job
    if _last_job_ref is None or _last_job_ref() is not job:
        return  # a newer map started since: it is the one last_job() returns
    _last_job = job if keep else None


class Observers:
    """The observers of one map, made by the registered factories when it starts."""

    def __init__(self, job: Any, progress: Any):
        self._job = weakref.ref(job)  # the job owns this; no cycle keeps an abandoned imap alive
        self._last_progress = 0.0
        self._list = []
        for factory in list(_observer_factories):
            try:
                obs = factory(job, progress)
            except Exception:  # a broken display must never break a map
                logger.exception("jupyter_cluster: progress observer factory failed")
                continue
            if obs is not None:
                self._list.append(obs)

    def maybe_progress(self) -> None:
        """``job_progress``, unless observers heard it less than :data:`PROGRESS_INTERVAL` ago."""
        now = time.monotonic()
        if now - self._last_progress >= PROGRESS_INTERVAL:
            self._last_progress = now
            self.notify("job_progress")

    def notify(self, method: str) -> None:
        """Call ``method(job)`` of every observer that has it."""
        job = self._job()
        if job is None:
            return
        for obs in self._list:
            fn = getattr(obs, method, None)
            if fn is None:
                continue
            try:
                fn(job)
            except Exception:
                logger.exception("jupyter_cluster: progress observer %s failed", method)
