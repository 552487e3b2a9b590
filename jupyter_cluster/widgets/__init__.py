"""Notebook widgets: the cluster view, the launcher and live metric charts.

Progress bars live with their model in :mod:`jupyter_cluster.tracking.progress`.
Importing this package is cheap; ipywidgets is imported when a widget is made
(the submodules are imported on first use, deliberately).  A
:class:`~jupyter_cluster.cluster.session.ClusterHandle` shows as the live widget through
IPython's display formatter, registered by :func:`register_display` (the session
layer below knows nothing of widgets).
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["launcher", "show_metrics", "show_runs", "cluster_widget", "register_display"]


def register_display(ipython: Any = None) -> None:
    """Show cluster handles in ``ipython`` (the running shell by default) as the live widget.

    A widget in a kernel, status text in a terminal; the handle's own
    ``_repr_html_`` stays the static fallback.  Called by ``%load_ext
    jupyter_cluster``, and by ``import jupyter_cluster`` in a running shell
    (which imports this package for it, and so nothing of ipywidgets or the
    session: the formatter is found by the class's name when a handle is
    first shown).
    """
    if ipython is None:
        if "IPython" not in sys.modules:  # not in IPython: nothing displays a handle
            return
        from IPython import get_ipython

        ipython = get_ipython()
        if ipython is None:
            return
    # by module and class name, resolved when a handle is first shown: %load_ext imports no session (distributed)
    ipython.display_formatter.mimebundle_formatter.for_type_by_name(
        "jupyter_cluster.cluster.session", "ClusterHandle", _handle_mimebundle
    )


def _handle_mimebundle(handle: Any) -> dict | tuple[dict, dict] | None:
    try:
        from .cluster import mimebundle
    except ImportError:  # no ipywidgets: IPython falls back to the handle's HTML
        return None
    return mimebundle(handle)


def launcher():
    """A widget to start, scale and stop a cluster (backend, workers, threads, memory limit).

    The cluster it starts becomes the current one.

    Examples
    --------
    >>> import jupyter_cluster as jc
    >>> jc.launcher()      # doctest: +SKIP
    """
    from .launcher import Launcher  # lazy, as every widget module here: ipywidgets on first use

    return Launcher()


def show_metrics(topic: str = "default", cluster: Any = None):
    from .metrics import show_metrics as _show

    return _show(topic, cluster)


def show_runs(runs: Any = None, *, topic: str | None = None, notebook: str | None = None, run: str | None = None):
    from .sweep import show_runs as _show

    return _show(runs, topic=topic, notebook=notebook, run=run)


def cluster_widget(handle: Any = None, live: bool = True):
    """The live cluster widget of ``handle`` (the current cluster by default)."""
    from ..cluster import session
    from .cluster import ClusterWidget

    return ClusterWidget(handle if handle is not None else session.get(), live=live)


show_metrics.__doc__ = (
    """Live charts of what tasks report on ``topic`` (see :func:`jupyter_cluster.widgets.metrics.show_metrics`)."""
)
show_runs.__doc__ = """The sweep table: runs' config and metrics, sorted, filtered, grouped, overlaid (see :func:`jupyter_cluster.widgets.sweep.show_runs`)."""
