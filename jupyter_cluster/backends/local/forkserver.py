"""Worker processes forked from a fork server that has imported distributed already.

Standard library and dask.config only: :func:`start_early` begins the server
before this process imports distributed (``jupyter_cluster.start``,
``%load_ext``), so that the server's import of distributed and this process's
run side by side on two cores.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from ... import config
from .sigint import sigint_blocked_for_children


# -- worker processes from a fork server ------------------------------------------------
def _forkserver_is_private() -> bool:
    """Whether multiprocessing's fork server listens where only this user can connect.

    Before Python 3.10.9 / 3.11.1 it listened on a Linux abstract socket, which
    any local user could use to run code as us (CVE-2022-42919); since, on a
    0600 socket file in a 0700 folder.
    """
    version = sys.version_info[:3]
    return (3, 10, 9) <= version < (3, 11) or version >= (3, 11, 1)


#: what the fork server imports for every worker: distributed, and what of ours runs on a worker (the
#: worker plugins a local cluster's workers start with, and the engine's worker side)
WORKER_MODULES = ["distributed", "jupyter_cluster.backends.local.workers", "jupyter_cluster.engine.worker"]

_forkserver_lock = threading.Lock()
#: this process's environment when it started the fork server (None: it did not start one)
_forkserver_environ: dict[str, str] | None = None
_forkserver_thread: threading.Thread | None = None
_preload_set = False


def distributed_setting(key: str) -> Any:
    """``key`` of dask.config, or distributed's default for it before distributed is imported.

    distributed adds its defaults (``distributed.yaml``) to dask.config when it
    is imported; the user's own settings (files, ``DASK_*`` variables) are there
    from the start.  Before, the default is read from distributed's file itself.
    """
    import dask.config

    value = dask.config.get(key, None)
    if value is not None or "distributed.config" in sys.modules:
        return value
    import importlib.util

    import yaml

    spec = importlib.util.find_spec("distributed")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "distributed.yaml")
    try:
        with open(path) as f:
            node: Any = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except OSError:
        return None
    for part in key.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def start_early(backend: str | None, options: dict) -> None:
    """Begin the fork server of a local start now, if this process has not imported distributed yet.

    Called by ``jupyter_cluster.start`` and ``%load_ext jupyter_cluster``
    before they import the rest of the package: the server (a fresh
    interpreter that imports distributed) and this process then import
    distributed at the same time, on two cores, instead of one after the
    other.  Nothing is checked or started that the start itself would refuse
    (a remote backend, ``processes=False``, ``--gpus``, a script without its
    ``__main__`` guard, the fork server switched off).
    """
    if "distributed" in sys.modules or _forkserver_thread is not None:
        return  # imported already: the start begins the server itself (LocalBackend.prepare)
    try:
        if (backend or config.get("backend")) != "local":
            return
        if options.get("processes") is False or options.get("gpus") not in (None, False):
            return
        from .main_guard import check_main_guard

        check_main_guard(options.get("processes"))
        if use_forkserver():
            start_forkserver()
    except Exception:  # noqa: BLE001 - the start itself reports what is wrong, in its own words
        return


def use_forkserver() -> bool:
    """Whether local workers start from a fork server with distributed already imported.

    Dask spawns each worker process as a fresh interpreter that imports
    distributed: 0.4-0.5 s of CPU per worker, half of a 1.0 s first start of
    2 workers on 2 cores.  A fork server (one interpreter with distributed
    imported, started with the first cluster) forks them instead: 0.09 s of
    CPU per worker.  Only Dask's
    default method ("spawn") is replaced, as for the settings above, and not
    when ``jupyter-cluster.local.forkserver`` is false, on platforms without
    fork servers, or when another part of this process runs one we did not
    start (its workers' signal mask and environment would be unknown).
    """
    import multiprocessing

    import dask.config

    key = "distributed.worker.multiprocessing-method"
    method = distributed_setting(key)
    ours = _forkserver_thread is not None
    if not config.get("local.forkserver", True):
        if method == "forkserver" and ours:  # switched off after we chose it: back to Dask's default
            dask.config.set({key: "spawn"})
        return False
    if method == "forkserver" and ours:
        return True
    if method != "spawn" or "forkserver" not in multiprocessing.get_all_start_methods() or not _forkserver_is_private():
        return False
    from multiprocessing import forkserver

    if getattr(forkserver._forkserver, "_forkserver_pid", None) is not None and not ours:  # someone else's
        return False
    dask.config.set({key: "forkserver"})
    return True


def start_forkserver() -> threading.Thread:
    """Start the fork server in a thread (a no-op when it runs already); returns the thread.

    In a thread beside the scheduler's start, the server's import of
    distributed overlaps the scheduler's import of its dashboard.  The server
    gets what a spawned worker would get from this process: SIGINT blocked
    (see :func:`sigint_blocked_for_children`), and the environment Dask sets
    before spawning (``distributed.nanny.pre-spawn-environ``, e.g.
    ``OMP_NUM_THREADS=1``, which the nannies put into this process's
    environment anyway).  It preloads :data:`WORKER_MODULES`: nothing of the
    notebook side (the package's ``__init__`` leaves it out in the fork server
    as in workers), and nothing that holds per-process random state (numpy's
    global generator, say, is imported by each worker after the fork).
    """
    global _forkserver_thread, _preload_set
    import multiprocessing

    with _forkserver_lock:
        # distributed's own preload list (set by its first get_mp_context) also imports numpy
        # and pandas into the notebook's process; ours is WORKER_MODULES.  Its flag is set once
        # distributed is imported (the server may have started before).
        dist_utils = sys.modules.get("distributed.utils")
        if dist_utils is not None and not getattr(dist_utils, "_forkserver_preload_set", False):
            if not _preload_set:
                multiprocessing.get_context("forkserver").set_forkserver_preload(WORKER_MODULES)
            setattr(dist_utils, "_forkserver_preload_set", True)  # noqa: B010 - distributed's own flag
            _preload_set = True
        if _forkserver_thread is not None and (_forkserver_thread.is_alive() or _forkserver_environ is not None):
            return _forkserver_thread  # started (or starting) already; the server itself is checked by the nannies
        if not _preload_set:
            multiprocessing.get_context("forkserver").set_forkserver_preload(WORKER_MODULES)
            _preload_set = True
        pre_spawn = distributed_setting("distributed.nanny.pre-spawn-environ") or {}
        env = {k: str(v) for k, v in pre_spawn.items() if v is not None}
        env.setdefault("PYTHONHASHSEED", "6640")  # as the nanny sets it: the same hashing in every worker
        for k, v in env.items():
            os.environ.setdefault(k, v)

    def run() -> None:
        global _forkserver_environ
        from multiprocessing import forkserver

        with _forkserver_lock:
            if _forkserver_environ is None:
                _forkserver_environ = dict(os.environ)
            try:
                with sigint_blocked_for_children():
                    forkserver.ensure_running()
            except Exception:
                # A thread's traceback on stderr says nothing useful: the nannies start the
                # server themselves on their first process start, and raise what went wrong.
                pass

    with _forkserver_lock:
        _forkserver_thread = threading.Thread(target=run, name="jupyter-cluster-forkserver", daemon=True)
        _forkserver_thread.start()
        return _forkserver_thread


def environ_since_forkserver() -> dict[str, str]:
    """Variables set or changed in this process's environment since the fork server started.

    A forked worker inherits the server's environment, not the notebook's
    current one; the nannies set these in each worker before it runs anything.
    (A variable deleted meanwhile stays in the workers.)
    """
    if _forkserver_environ is None:
        return {}
    return {k: v for k, v in os.environ.items() if _forkserver_environ.get(k) != v}
