"""Notebook widgets: the cluster view, the launcher and live metric charts.

Progress bars live with their model in :mod:`jupyter_cluster.progress`.
Importing this package is cheap; ipywidgets is imported when a widget is made.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["launcher", "show_metrics", "cluster_widget", "register_commands"]


def launcher():
    """A widget to start, scale and stop a cluster (backend, workers, threads, memory limit).

    The cluster it starts becomes the current one.

    Examples
    --------
    >>> import jupyter_cluster as jc
    >>> jc.launcher()      # doctest: +SKIP
    """
    from .launcher import Launcher

    return Launcher()


def show_metrics(topic: str = "default", cluster: Any = None):
    from .metrics import show_metrics as _show

    return _show(topic, cluster)


def cluster_widget(handle: Any = None, live: bool = True):
    """The live cluster widget of ``handle`` (the current cluster by default)."""
    from .. import session
    from .cluster import ClusterWidget

    return ClusterWidget(handle if handle is not None else session.get(), live=live)


def register_commands() -> None:
    """Add ``%cluster metrics TOPIC`` to the ``%cluster`` magic."""
    from .. import magics
    from .metrics import metrics_command

    magics.EXTRA_COMMANDS.setdefault("metrics", metrics_command)


show_metrics.__doc__ = (
    """Live charts of what tasks report on ``topic`` (see :func:`jupyter_cluster.widgets.metrics.show_metrics`)."""
)

# Worker processes import this package too; only a process that already has
# the magics (IPython) pays for registering, the others get it at %load_ext.
if "jupyter_cluster.magics" in sys.modules:
    register_commands()
