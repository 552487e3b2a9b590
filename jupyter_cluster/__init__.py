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
from .mapping import imap, last_job, map  # noqa: A004  (jupyter_cluster.map is the public map)
from .pool import Pool
from .dqueue import Queue
from .actors import actor
from .events import metrics, report
from .widgets import launcher, show_metrics
from .spmd import spmd  # noqa: E402  (the function; import the module's other names with `from jupyter_cluster.spmd import ...`)

__version__ = "0.1.0"

from .progress import install as _install_progress  # noqa: E402

_install_progress()  # progress bars for every map, once the map engine is importable

__all__ = [
    "CellError",
    "Pool",
    "Queue",
    "actor",
    "launcher",
    "metrics",
    "report",
    "show_metrics",
    "spmd",
    "ClusterError",
    "ClusterHandle",
    "SerializationError",
    "clusters",
    "connect",
    "current",
    "imap",
    "last_job",
    "load_ipython_extension",
    "map",
    "start",
    "stop",
]


def load_ipython_extension(ipython):
    """Register ``%cluster`` and ``%%parallel`` (``%load_ext jupyter_cluster``)."""
    from .magics import register_magics
    from .widgets import register_commands

    register_magics(ipython)
    register_commands()  # %cluster metrics
    _import_engine_in_background()


def _import_engine_in_background() -> None:
    # Importing Dask's distributed takes about a second on a small machine,
    # and the scheduler's dashboard (bokeh) nearly as long again.  Doing it
    # while the user writes the next cell takes both off `%cluster start`; a
    # start that comes sooner waits for this thread to finish (see
    # _wait_for_background_import), so nothing is imported twice.
    import threading

    def run():
        # The engine, the scheduler's dashboard, and the cluster widget's toolkit.
        for name in ("distributed", "distributed.dashboard.scheduler", "ipywidgets"):
            try:
                __import__(name)
            except Exception:  # the start itself reports a broken installation
                pass

    global _import_thread
    _import_thread = threading.Thread(target=run, name="jupyter-cluster-import", daemon=True)
    _import_thread.start()


_import_thread = None


def _wait_for_background_import(timeout: float = 60.0) -> None:
    """Let the background import finish before a cluster starts.

    Starting a scheduler imports the dashboard modules too.  Two threads
    importing the same package's modules can each hold a module the other
    needs; Python then breaks the cycle by handing one of them a half-built
    module ("module 'distributed.dashboard' has no attribute 'scheduler'").
    """
    thread = _import_thread
    if thread is not None and thread.is_alive():
        thread.join(timeout)


# -- Jupyter server and JupyterLab extension hooks (the extension template's names) --
def _jupyter_labextension_paths():
    """Where the prebuilt JupyterLab extension lives (``jupyter labextension develop``)."""
    return [{"src": "labextension", "dest": "jupyter-cluster"}]


def _jupyter_server_extension_points():
    return [{"module": "jupyter_cluster"}]


def _load_jupyter_server_extension(serverapp):
    """Start the cluster manager and its routes under ``<base_url>/jupyter-cluster/api/``."""
    from .server import load

    load(serverapp)
