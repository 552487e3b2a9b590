"""A map that waits on workers that cannot run it: none at all (:class:`NoWorkersNotice`), or all paused.

Dask pauses a worker whose process memory passes its ``pause`` fraction of
the worker's memory limit (80 % by default): a paused worker starts no new
task, so no lease (or chunk task) of a map starts there.  Without a word the
cell looked frozen; a cluster whose workers all paused waited 300 s in a CI
run (issue 37).  :class:`PausedWatch` looks at the workers only while the map
makes no progress, says within :data:`NOTICE_SECONDS` which workers are
paused with their memory against their limit and what to do, and keeps
waiting only while a worker may still resume: after :data:`GIVE_UP_SECONDS`
with nothing in flight and every worker still paused, the map fails with
that sentence (its results so far stay in ``last_job().results``).  A cluster
with no worker at all is told once, after :data:`NO_WORKERS_NOTICE_SECONDS`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from dask.utils import format_bytes

from ..errors import ClusterError
from .cluster import worker_slots

#: How long a map waits on a cluster without workers before saying so, in seconds.
NO_WORKERS_NOTICE_SECONDS = 5.0
#: A map with no progress for this long looks at whether its workers are paused, in seconds.
NOTICE_SECONDS = 2.0
#: Every worker paused, nothing in flight and no progress for this long: the map fails, in seconds.
GIVE_UP_SECONDS = 30.0
#: How often a stalled map with nothing in flight asks the scheduler about its workers, in seconds.
LOOK_EVERY_SECONDS = 1.0
#: The same for a map with work in flight (long items, or tasks queued on the task path), in seconds.
BUSY_LOOK_EVERY_SECONDS = 10.0


def describe(workers: dict[str, dict]) -> str:
    """``"tls://…:1 (name): 0.95 GiB of 1.00 GiB"`` for each paused worker (at most 8 named)."""
    parts = []
    for addr, info in sorted(workers.items())[:8]:
        name = info.get("name")
        label = f"{addr} ({name})" if name not in (None, "", addr) else addr
        memory = (info.get("metrics") or {}).get("memory")
        limit = info.get("memory_limit")
        used = format_bytes(int(memory)) if isinstance(memory, (int, float)) else "?"
        cap = format_bytes(int(limit)) if limit else "no limit"
        parts.append(f"{label}: {used} of {cap}")
    if len(workers) > 8:
        parts.append(f"and {len(workers) - 8} more")
    return "; ".join(parts)


class PausedWatch:
    """Watches one map for the case where it waits only on paused workers.

    Parameters
    ----------
    workers : callable
        ``workers() -> {address: info}``, the scheduler's workers now
        (:func:`.cluster.workers_now`).
    where : str
        How messages name the cluster (``"cluster 'sweep'"``).
    resources : dict or None
        The map's resources: a running worker without them cannot run it.
    """

    def __init__(self, workers: Callable[[], dict[str, dict]], where: str, resources: dict | None = None):
        self._workers = workers
        self._where = where
        self._resources = resources
        self._progress = -1
        self._progress_at = time.monotonic()
        self._next_look = 0.0
        self._paused_since: float | None = None
        self._told = False

    def check(self, progress: int, idle: bool, now: float | None = None) -> None:
        """Called every half second or so by the map; ``progress``: items done; ``idle``: nothing in flight.

        Prints the notice once, raises :class:`~jupyter_cluster.errors.ClusterError` on giving up.
        """
        now = time.monotonic() if now is None else now
        if progress != self._progress:
            self._progress, self._progress_at = progress, now
            self._paused_since = None
            return
        if now - self._progress_at < NOTICE_SECONDS or now < self._next_look:
            return
        # Work in flight on a running lease will show progress: look seldom then (a round trip to the scheduler).
        self._next_look = now + (LOOK_EVERY_SECONDS if idle else BUSY_LOOK_EVERY_SECONDS)
        try:
            workers = self._workers()
        except Exception:  # noqa: BLE001 - a scheduler that went away is the connection check's to report
            return
        runnable = [
            a for a, w in workers.items() if w.get("status") == "running" and worker_slots(w, self._resources) > 0
        ]
        paused = {a: w for a, w in workers.items() if w.get("status") == "paused"}
        if runnable or not paused:
            self._paused_since = None
            return
        if self._paused_since is None:
            self._paused_since = now
        if not self._told:
            self._told = True
            print(f"jupyter_cluster: {self._sentence(paused)}", file=sys.stderr, flush=True)
        if idle and now - self._paused_since >= GIVE_UP_SECONDS:
            raise ClusterError(
                f"{self._sentence(paused, waiting=False)} They stayed paused for {GIVE_UP_SECONDS:g} s, so the map "
                "stopped; its results so far are in jupyter_cluster.last_job().results."
            )

    def _sentence(self, paused: dict[str, Any], waiting: bool = True) -> str:
        what = (
            f"every worker of {self._where} is paused by Dask because its memory is over the pause threshold "
            f"(memory used of the worker's limit: {describe(paused)})"
        )
        todo = (
            "free memory there (del large results and values held on the workers), or restart the cluster with "
            "a larger --memory-limit (%cluster stop, then %cluster start --memory-limit ...)"
        )
        if waiting:
            return (
                f"{what}, so the map is waiting for one to resume; {todo}, or interrupt to stop. "
                f"The map stops if none resumes within {GIVE_UP_SECONDS:g} s."
            )
        return f"{what[0].upper()}{what[1:]}; {todo}."


class NoWorkersNotice:
    """Says once why nothing happens when the cluster has no workers.

    Waiting is right (an adaptive cluster will add workers, a scaled one is
    starting them), so this informs rather than fails.

    Parameters
    ----------
    threads : callable
        Worker threads as of the client's own periodic update, None before the
        first: the client refreshes it every 2 s by itself, and asking the
        scheduler once a second cost a round trip that grows with the cluster.
    adaptive : callable
        Whether the map asked the cluster for workers (:mod:`.demand`): they may be queued.
    where : str
        How the message names the cluster.
    """

    def __init__(self, threads: Callable[[], int | None], adaptive: Callable[[], bool], where: str):
        self._threads = threads
        self._adaptive = adaptive
        self._where = where
        self._since: float | None = None
        self._told = False

    def check(self, now: float) -> None:
        """Called every half second or so by the map; prints the notice once."""
        if self._told:
            return
        threads = self._threads()
        if threads is None:
            return
        if threads > 0:
            self._since = None
            return
        if self._since is None:
            self._since = now
        elif now - self._since > NO_WORKERS_NOTICE_SECONDS:
            self._told = True
            if self._adaptive():
                print(
                    f"jupyter_cluster: {self._where} has no workers yet; the map waits while its adaptive scaling adds "
                    "some (a batch system may keep them queued), or interrupt to stop.",
                    file=sys.stderr,
                )
                return
            print(
                f"jupyter_cluster: {self._where} has no workers, so the map is waiting; add some with %cluster scale N "
                "(or jupyter_cluster.current().scale(N)), or interrupt to stop.",
                file=sys.stderr,
            )
