"""Notebook widgets: the cluster view, the launcher and live metric charts.

Progress bars live with their model in :mod:`jupyter_cluster.telemetry.progress`.
Importing this package is cheap; ipywidgets is imported when a widget is made.
"""

from __future__ import annotations

from typing import Any

__all__ = ["launcher", "show_metrics", "show_runs", "cluster_widget"]


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


def show_runs(runs: Any = None, *, topic: str | None = None, notebook: str | None = None, run: str | None = None):
    from .sweep import show_runs as _show

    return _show(runs, topic=topic, notebook=notebook, run=run)


def cluster_widget(handle: Any = None, live: bool = True):
    """The live cluster widget of ``handle`` (the current cluster by default)."""
    from .. import session
    from .cluster import ClusterWidget

    return ClusterWidget(handle if handle is not None else session.get(), live=live)


show_metrics.__doc__ = (
    """Live charts of what tasks report on ``topic`` (see :func:`jupyter_cluster.widgets.metrics.show_metrics`)."""
)
show_runs.__doc__ = """The sweep table: runs' config and metrics, sorted, filtered, grouped, overlaid (see :func:`jupyter_cluster.widgets.sweep.show_runs`)."""
