"""Telemetry: metrics and job progress from the workers to the notebook and the sidebar.

A reported metric goes ``report()`` (:mod:`.producer`: validated, tagged with
its run by :mod:`.tags`, buffered, numbered per producer) ─► a Dask event topic
(:mod:`.topic_names`) ─► the scheduler ─► :func:`.hub.follow` in the kernel
(:class:`.hub.Hub`) and in the Jupyter server (``server.manager``) ─► a
:class:`.topic_store.TopicStore` ─► a chart model.  Map jobs' progress
(``tracking.progress``) travels the same way on the jobs topic.
"""

from __future__ import annotations

from .._core.lazy import attach as _attach

#: Public name -> the module that defines it.  Loaded on first use: a worker process imports
#: telemetry.tags (for the engine) without the hub, the stores and the JSON models.
_NAMES = {
    **dict.fromkeys(["Hub", "attach", "attached", "follow", "metrics", "sync"], ".hub"),
    **dict.fromkeys(["flush", "identity_fields", "publish", "report", "validate"], ".producer"),
    **dict.fromkeys(["TopicStore", "records", "series_key", "store", "topics"], ".topic_store"),
    **dict.fromkeys(
        ["CONTROL_TOPIC", "INDEX_TOPIC", "JOBS_TOPIC", "PLUGIN_NAME", "PREFIX", "SPMD_OUTPUT_TOPIC", "topic_name"],
        ".topic_names",
    ),
}
__getattr__, __dir__ = _attach(__name__, _NAMES)

__all__ = [
    "CONTROL_TOPIC",
    "INDEX_TOPIC",
    "JOBS_TOPIC",
    "PLUGIN_NAME",
    "PREFIX",
    "SPMD_OUTPUT_TOPIC",
    "Hub",
    "TopicStore",
    "attach",
    "attached",
    "flush",
    "follow",
    "identity_fields",
    "metrics",
    "publish",
    "records",
    "report",
    "series_key",
    "store",
    "sync",
    "topic_name",
    "topics",
    "validate",
]
