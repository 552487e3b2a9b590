"""jupyter_cluster: Jupyter-native parallel computing on Dask.

In a notebook::

    %load_ext jupyter_cluster
    %cluster start
    %%parallel seed in range(100) --out rewards
    ...

From Python: :func:`start`, :func:`connect`, :func:`current`, :func:`clusters`,
:func:`stop`.
"""

from __future__ import annotations

from . import config  # noqa: F401  (registers dask.config defaults)
from .errors import CellError, ClusterError, SerializationError
from .session import ClusterHandle, clusters, connect, current, start, stop
from .pool import Pool
from .dqueue import Queue
from .actors import actor

__version__ = "0.1.0"

__all__ = [
    "CellError",
    "Pool",
    "Queue",
    "actor",
    "ClusterError",
    "ClusterHandle",
    "SerializationError",
    "clusters",
    "connect",
    "current",
    "load_ipython_extension",
    "start",
    "stop",
]


def load_ipython_extension(ipython):
    """Register ``%cluster`` and ``%%parallel`` (``%load_ext jupyter_cluster``)."""
    from .magics import register_magics

    register_magics(ipython)
