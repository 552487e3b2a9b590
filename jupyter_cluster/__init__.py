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
import sys as _sys

from ._core import tls_defaults as _tls_defaults
from ._core.context import in_worker_process as _in_dask_worker_process

if not _in_dask_worker_process():  # a worker makes it when it needs it (a forked one inherits it)
    _tls_defaults.begin()  # tornado's default TLS context, made while the rest is imported (see the module)

from . import config  # noqa: E402, F401  (registers dask.config defaults)
from ._core.lazy import attach as _attach  # noqa: E402
from .errors import CellError, ClusterError, SerializationError  # noqa: E402

#: Public name -> module that defines it.
_PUBLIC = {
    "ClusterHandle": ".cluster.session", "clusters": ".cluster.session", "connect": ".cluster.session",
    "current": ".cluster.session", "imap": ".mapping", "last_job": ".mapping", "map": ".mapping",
    "Pool": ".pool", "Queue": ".primitives.queue", "actor": ".primitives.actors", "metrics": ".telemetry",
    "report": ".telemetry", "launcher": ".widgets", "show_metrics": ".widgets", "show_runs": ".widgets",
    "spmd": ".collective.client", "run": ".tracking.runs", "runs": ".tracking.runs",
    "submit": ".detached.jobs", "job": ".detached.jobs", "jobs": ".detached.jobs",
}  # fmt: skip

# Every public name is imported on its first use, in the notebook as in a worker process (which
# imports the package only to unpickle what runs there: engine.worker, cellfunc, a Pool task; that
# cut 0.1-0.3 s per worker process off `%cluster start`).  `import jupyter_cluster` imports neither
# distributed nor the notebook side, so that `start` can begin the local cluster's fork server
# before either is imported (see `start`).
_import_public, _dir_public = _attach(__name__, _PUBLIC)


def __getattr__(name: str):
    if name == "__version__":
        # written once, in package.json; read on first use: importlib.metadata parses e-mail headers
        from importlib.metadata import version

        globals()["__version__"] = value = version("jupyter-cluster")
        return value
    if _PUBLIC.get(name) == ".telemetry" and not _in_dask_worker_process():
        # the notebook's own reports reach its charts through the kernel sink that the session
        # installs on import; a worker's go to the scheduler and must not import the notebook side
        _importlib.import_module(".cluster.session", __name__)
    return _import_public(name)


def __dir__() -> list[str]:
    return sorted({*_dir_public(), "__version__"})


def start(
    name: str | None = None,
    backend: str | None = None,
    wait: bool = True,
    keep: bool = False,
    idle_timeout: str | float | None = None,
    **options,
):
    """Start a cluster and make it the current one (:func:`jupyter_cluster.cluster.session.start`).

    Parameters
    ----------
    name : str, optional
        Unique name; defaults to ``<backend>-<n>``.
    backend : str, optional
        Backend name; defaults to ``jupyter-cluster.backend`` from dask.config.
    wait : bool
        Wait until the first worker has connected (``False``: a batch backend
        returns once its jobs are submitted).
    keep : bool
        Run the cluster in a host process that is not this kernel, so that it
        outlives it (a kernel restart, a crash, a Jupyter server restart) and
        takes detached jobs (:func:`submit`); this process attaches to it, and
        any other attaches with :func:`connect` by name.
    idle_timeout : str or float, optional
        With ``keep``: the cluster stops itself after this long with no
        running detached job and no attached kernel ("30min", seconds; 0 =
        never; default ``jupyter-cluster.detached.idle-timeout``).
    **options
        Backend options, e.g. ``workers=8, threads=1, memory_limit="2GiB"``.

    Returns
    -------
    ClusterHandle

    Notes
    -----
    A local start begins its fork server (the interpreter the worker
    processes are forked from) before this process imports distributed and
    the rest of the package, so that both imports run at once on two cores.

    Examples
    --------
    >>> import jupyter_cluster as jc
    >>> cluster = jc.start(workers=2)          # doctest: +SKIP
    """
    if keep:
        from .detached.kept import start as start_kept

        return start_kept(name, backend, idle_timeout, wait=wait, **options)
    if idle_timeout is not None:
        raise ClusterError("idle_timeout is for kept clusters; add keep=True.")
    from .backends.local.forkserver import start_early

    start_early(backend, options)
    from .cluster.session import start as session_start

    return session_start(name, backend, wait, **options)


def stop(name: str | None = None) -> str:
    """Stop (or detach from) a cluster; returns its name (:func:`jupyter_cluster.cluster.session.stop`).

    A kept cluster (``start(keep=True)``) is stopped by its host process, with
    its detached jobs (their finished results stay on disk).
    """
    from .cluster import session
    from .detached import kept

    target = name if name is not None else getattr(session.current(), "name", None)
    if target is not None and kept.is_kept(target):
        return kept.stop(target)
    return session.stop(name)


if not _in_dask_worker_process() and "IPython" in _sys.modules:
    # a handle shows as the live widget in a running IPython; widgets (not ipywidgets) is cheap to import
    from .widgets import register_display as _register_display

    _register_display()

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
    "job",
    "jobs",
    "last_job",
    "load_ipython_extension",
    "map",
    "start",
    "stop",
    "submit",
]


def load_ipython_extension(ipython):
    """Register ``%cluster`` and ``%%parallel`` (``%load_ext jupyter_cluster``)."""
    # lazy: IPython's magics machinery loads only when an IPython shell loads the extension
    from .backends.local.forkserver import start_early

    # A local cluster's fork server, while the next cell is written: %cluster start then forks its
    # workers at once (a first start right after %load_ext, 2 workers on 2 cores: 0.81-0.87 s, against
    # 1.23-1.25 s when the start begins it; benchmarks/startup.py --cases kernel).  A notebook that
    # never starts one pays one idle process (about 40 MB) and 0.5 s of CPU on another core; its own
    # environment is left alone.
    start_early(None, {})
    from ._core import background as _background
    from .magics import register_magics
    from .widgets import register_display

    register_magics(ipython)
    register_display(ipython)
    _background.start()  # distributed and ipywidgets, while the next cell is written


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
