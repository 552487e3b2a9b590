"""Every Dask event topic jupyter_cluster uses, in one place.

Kernels, workers, the Jupyter server extension and the sidebar meet on these
names (the sidebar only through the server).  Metrics travel on one topic per
metrics topic (:func:`topic_name`) *and* on :data:`INDEX_TOPIC`; job progress on
:data:`JOBS_TOPIC`; the panel's scale/adapt/stop requests and their replies on
:data:`CONTROL_TOPIC`; the ranks' printed lines of a ``%%spmd`` cell on
:data:`SPMD_OUTPUT_TOPIC`.
"""

from __future__ import annotations

#: a metrics topic ``t`` travels on ``PREFIX + t``
PREFIX = "jupyter-cluster:metrics:"
#: every metrics batch is logged here too, so one subscription sees every topic, new ones included
INDEX_TOPIC = "jupyter-cluster:metrics"
#: one message per progress update of a map job (:mod:`jupyter_cluster.tracking.progress`)
JOBS_TOPIC = "jupyter-cluster:jobs"
#: the panel's requests to the kernel that owns a cluster, and the replies (:mod:`jupyter_cluster.cluster.control`)
CONTROL_TOPIC = "jupyter-cluster:control"
#: a ``%%spmd`` cell's printed lines, streamed from the ranks while the cell runs
SPMD_OUTPUT_TOPIC = "jupyter-cluster:spmd-output"
#: the name of the worker plugin that flushes reports when a task ends
PLUGIN_NAME = "jupyter-cluster-events"


def topic_name(topic: str) -> str:
    """The Dask event topic that carries metrics topic ``topic``."""
    return PREFIX + topic
