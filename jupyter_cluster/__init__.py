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

import importlib as _importlib
import multiprocessing as _multiprocessing
import sys as _sys

from . import config  # noqa: F401  (registers dask.config defaults)
from .errors import CellError, ClusterError, SerializationError

#: Public name -> module that defines it.
_PUBLIC = {
    "ClusterHandle": ".session", "clusters": ".session", "connect": ".session", "current": ".session",
    "start": ".session", "stop": ".session", "imap": ".mapping", "last_job": ".mapping", "map": ".mapping",
    "Pool": ".pool", "Queue": ".dqueue", "actor": ".actors", "metrics": ".telemetry", "report": ".telemetry",
    "launcher": ".widgets", "show_metrics": ".widgets", "show_runs": ".widgets", "spmd": ".spmd", "run": ".runs", "runs": ".runs",
}  # fmt: skip


def _in_dask_worker_process() -> bool:
    """Whether this process is a Dask worker (started by a nanny, or by ``dask worker --no-nanny``).

    Or the fork server local workers are forked from (``backends.local``), which
    preloads their modules.
    """
    if _multiprocessing.current_process().name == "Dask Worker process (from Nanny)":
        return True
    if any("from multiprocessing.forkserver import main" in arg for arg in getattr(_sys, "orig_argv", ())):
        return True
    spec = getattr(_sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) == "distributed.cli.dask_worker"


def __getattr__(name: str):
    if name == "__version__":
        # written once, in package.json; read on first use: importlib.metadata parses e-mail headers
        from importlib.metadata import version

        globals()["__version__"] = value = version("jupyter-cluster")
        return value
    # A worker process imports the package only to unpickle what runs there
    # (engine.worker, cellfunc, a Pool task): the notebook side (sessions,
    # telemetry hub, widgets, %%spmd) is imported on first use of its name,
    # which cut 0.1-0.3 s per worker process off `%cluster start`.
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'jupyter_cluster' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


if not _in_dask_worker_process():
    from . import mapping as _mapping
    from .actors import actor
    from .dqueue import Queue
    from .mapping import imap, last_job, map  # noqa: A004  (jupyter_cluster.map is the public map)
    from .pool import Pool
    from .runs import run, runs  # the function `runs` shadows the module on the package: import its names from .runs
    from .session import ClusterHandle, clusters, connect, current, start, stop
    from .spmd import spmd  # noqa: E402  (the function; import the module's other names with `from jupyter_cluster.spmd import ...`)
    from .telemetry import metrics, report
    from .telemetry.progress import install as _install_progress  # noqa: E402
    from .widgets import launcher, show_metrics, show_runs
    from .widgets import register_display as _register_display

    _install_progress(_mapping.add_observer_factory)  # progress bars for every map
    _register_display()  # cluster handles as live widgets, in a running IPython

__all__ = [
    "CellError",
    "Pool",
    "Queue",
    "actor",
    "launcher",
    "metrics",
    "report",
    "run",
    "runs",
    "show_metrics",
    "show_runs",
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
    # lazy: IPython's magics machinery loads only when an IPython shell loads the extension
    from . import _background
    from .magics import register_magics
    from .widgets import register_display

    register_magics(ipython)
    register_display(ipython)
    _background.start()  # distributed's dashboard and ipywidgets, while the next cell is written


# -- Jupyter server and JupyterLab extension hooks (the extension template's names) --
def _jupyter_labextension_paths():
    """Where the prebuilt JupyterLab extension lives (``jupyter labextension develop``)."""
    return [{"src": "labextension", "dest": "jupyter-cluster"}]


def _jupyter_server_extension_points():
    return [{"module": "jupyter_cluster"}]


def _load_jupyter_server_extension(serverapp):
    """Start the cluster manager and its routes under ``<base_url>/jupyter-cluster/api/``."""
    from .server import load  # lazy: the server side loads only in a Jupyter server
    from .widgets.static_render import pre_save_hook

    load(serverapp)
    # a saved notebook keeps our widgets' static copies, not references to models that die with the kernel
    register = getattr(serverapp.contents_manager, "register_pre_save_hook", None)
    if register is not None:  # a custom contents manager may not take hooks
        register(pre_save_hook)
