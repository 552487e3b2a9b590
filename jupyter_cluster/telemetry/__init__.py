"""Telemetry: metrics and job progress from the workers to the notebook and the sidebar.

A reported metric goes ``report()`` (:mod:`.report`: validated, buffered,
numbered per producer) ─► a Dask event topic (:mod:`.topics`) ─► the scheduler
─► :func:`.hub.follow` in the kernel (:class:`.hub.Hub`) and in the Jupyter
server (``server.manager``) ─► a :class:`.store.TopicStore` ─► a chart model.
Map jobs' progress (:mod:`.progress`) travels the same way on the jobs topic.

The names below are the public face; the submodules ``report`` and ``store``
are reached as ``jupyter_cluster.telemetry.producer`` / ``.store`` with
``from ... import`` (the package attributes of those names are the functions).
"""

from __future__ import annotations

from .hub import Hub, attach, attached, follow, metrics, sync
from .producer import flush, identity_fields, publish, report, validate
from .topic_store import TopicStore, records, series_key, store, topics
from .topics import CONTROL_TOPIC, INDEX_TOPIC, JOBS_TOPIC, PLUGIN_NAME, PREFIX, SPMD_OUTPUT_TOPIC, topic_name

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
