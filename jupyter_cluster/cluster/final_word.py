"""The final word a stopping owner leaves the Jupyter server: the cluster's summary and this process's jobs.

Split out of :mod:`.session` (its ``stop`` calls :func:`leave_final_word`).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from ..state import registry
from ..telemetry.producer import drain
from ..telemetry.topic_store import PANEL_MODEL, all_stores
from ..tracking.record import kept_jobs
from ..wire.models import cluster_summary

logger = logging.getLogger(__name__)


def leave_final_word(handle: Any, gone: bool) -> None:
    """Before the record goes: send the queued job messages, and leave the server what this process kept.

    The Jupyter server follows a cluster a few seconds after its record appears
    (registry scan, connect, subscribe): one started, used and stopped faster
    than that would leave no trace in its history, jobs or runs.  The cluster's
    summary, this process's messages of its jobs and runs
    (:func:`jupyter_cluster.tracking.record.kept_jobs`) and this process's copy of
    the metrics topics those runs reported to go into a 0600 file beside the
    record (:func:`jupyter_cluster.state.registry.write_final`), which the server
    takes up at its next scan (a topic its own subscription had not read yet
    when the cluster stopped, too).  Nothing here may stop the cluster's stop.
    """
    if not gone:
        drain(handle.client)
    try:
        record = registry.read(handle.name)
        if record is None or record.owner_pid != os.getpid() or record.attached:
            return
        jobs = [j for j in kept_jobs() if j.get("cluster") == handle.name]
        runs = {j.get("run") for j in jobs if j.get("run")}
        jobs += [j for j in kept_jobs() if j.get("kind") == "run" and j.get("cluster") is None and j.get("run") in runs]
        if not jobs:
            return
        # the scheduler's own totals, as the server reads them (server.manager): the client's cached
        # list of workers may still be empty right after a start, and lists only some by default
        info = {} if gone else (handle.client.scheduler_info(n_workers=0) or {})
        totals = {
            "n_workers": int(info.get("n_workers") or 0),
            "cores": int(info.get("total_threads") or 0),
            "memory_limit": int(info.get("total_memory") or 0),
        }
        summary = cluster_summary(record, handle.dashboard_link, "stopped", None, totals, 0, ())
        registry.write_final(
            handle.name,
            {
                "format": 1,
                "key": handle.name,
                "record": {"address": record.address, "owner_pid": record.owner_pid, "started": record.started},
                "saved": time.time(),
                "summary": summary,
                "jobs": jobs,
                "topics": _topics_of(runs),
            },
        )
    except Exception:  # a full disk, a registry folder gone: the stop goes on
        logger.debug("could not leave the final word of %s", handle.name, exc_info=True)


def _topics_of(runs: set[Any]) -> list[dict[str, Any]]:
    """Snapshots (:meth:`.TopicStore.snapshot`) of this process's topics that hold items of ``runs``.

    A topic keeps every series it was sent (other clusters' too, where this
    process used the same topic with them), but only these runs' items.
    """
    out = []
    for store in all_stores():
        items = store.run_items(runs)
        if not items:
            continue
        snap = store.snapshot(**PANEL_MODEL)
        snap["runs"] = {run: v for run, v in snap["runs"].items() if run in runs}
        out.append(snap)
    return out
