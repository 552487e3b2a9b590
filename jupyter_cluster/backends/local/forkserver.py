"""Worker processes forked from a fork server that has imported distributed already.

Standard library and dask.config only: :func:`start_early` begins the server
before this process imports distributed (``jupyter_cluster.start``,
``%load_ext``), so that the server's import of distributed and this process's
run side by side on two cores.  The server starts with Dask's pre-spawn
environment; this process's own is left as the user has it.  A script that
has imported distributed by the time its cluster starts (and runs one thread)
gets a fork of itself as the server instead (:mod:`.fork_self`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from ... import config
from . import fork_self
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
#: worker plugins a local cluster's workers start with, and the engine's worker side), and what every
#: worker would compute alike (:mod:`.preload`)
WORKER_MODULES = [
    "distributed",
    "jupyter_cluster.backends.local.workers",
    "jupyter_cluster.engine.worker",
    "jupyter_cluster.backends.local.preload",
]

_forkserver_lock = threading.Lock()
#: the environment the fork server started with (None: this process did not start one)
_forkserver_environ: dict[str, str] | None = None
_forkserver_thread: threading.Thread | None = None


@functools.lru_cache(maxsize=1)
def _distributed_defaults() -> dict:
    """distributed's defaults (its ``distributed.yaml``), read as distributed reads them when it is imported."""
    spec = importlib.util.find_spec("distributed")
    if spec is None or not spec.submodule_search_locations:
        return {}
    path = os.path.join(list(spec.submodule_search_locations)[0], "distributed.yaml")
    import yaml

    try:
        with open(path) as f:
            # the C loader when there is one: 10 ms instead of 80 (distributed itself is imported in the background)
            return yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
    except OSError:
        return {}


def distributed_setting(key: str) -> Any:
    """``key`` of dask.config as it is once distributed is imported, also before that.

    distributed adds its defaults (``distributed.yaml``) to dask.config when it
    is imported; the user's own settings (files, ``DASK_*`` variables,
    ``dask.config.set``) are there from the start.  They are merged as
    distributed merges them (keys canonicalised, a user's partial mapping
    completed by the defaults), without importing distributed.
    """
    import dask.config

    merged = dask.config.merge(_distributed_defaults(), dask.config.config)
    return dask.config.get(key, None, config=merged)


def start_early(backend: str | None, options: dict, check_guard: bool = True) -> None:
    """Begin the fork server of a local start now, before the rest of the start is imported.

    Called by ``jupyter_cluster.start`` and ``%load_ext jupyter_cluster``
    before they import the rest of the package: the server (a fresh
    interpreter that imports distributed) then imports distributed while this
    process imports it and the session, on two cores, instead of after.
    Nothing is checked or started that the start itself would refuse (a
    remote backend, ``processes=False``, ``--gpus``, a script without its
    ``__main__`` guard, the fork server switched off).
    """
    if _forkserver_thread is not None:
        return  # begun already (the start itself checks it: LocalBackend.prepare)
    try:
        if (backend or config.get("backend")) != "local":
            return
        if options.get("processes") is False or options.get("gpus") not in (None, False):
            return
        if check_guard:
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

    The server gets what a spawned worker would get from this process: SIGINT
    blocked (see :func:`sigint_blocked_for_children`), and the environment
    Dask sets before spawning (``distributed.nanny.pre-spawn-environ``, e.g.
    ``OMP_NUM_THREADS=1``, and ``PYTHONHASHSEED``), in the server's own
    environment only: this process keeps the user's (numpy imported in the
    notebook keeps its threads).  It preloads :data:`WORKER_MODULES`: nothing
    of the notebook side (the package's ``__init__`` leaves it out in the fork
    server as in workers), and nothing that holds per-process random state
    (numpy's global generator, say, is imported by each worker after the fork).
    """
    global _forkserver_thread
    import multiprocessing
    from multiprocessing import forkserver

    with _forkserver_lock:
        utils = sys.modules.get("distributed.utils")
        if utils is not None:
            # distributed's first get_mp_context would set its own preload list, importing numpy and
            # pandas into this process for it; that flag exists once distributed is (being) imported,
            # which may be after the server started, so it is set at every call, before the nannies'.
            setattr(utils, "_forkserver_preload_set", True)  # noqa: B010 - distributed's private flag
        if _forkserver_thread is not None and (_forkserver_thread.is_alive() or _forkserver_environ is not None):
            return _forkserver_thread  # started (or starting) already; the server itself is checked by the nannies
        multiprocessing.get_context("forkserver").set_forkserver_preload(WORKER_MODULES)
        _workers_skip_main()
        env = _server_environ()

    def run() -> None:
        global _forkserver_environ
        from multiprocessing import forkserver

        with _forkserver_lock:
            try:
                with sigint_blocked_for_children(), _spawning_with(env):
                    forkserver.ensure_running()
                _forkserver_environ = env
            except Exception:
                # A thread's traceback on stderr says nothing useful: the nannies start the
                # server themselves on their first process start, and raise what went wrong.
                pass

    with _forkserver_lock:
        _forkserver_thread = threading.Thread(target=run, name="jupyter-cluster-forkserver", daemon=True)
        if not (fork_self.possible() and getattr(forkserver._forkserver, "_forkserver_pid", None) is None):
            _forkserver_thread.start()
            return _forkserver_thread
    # A script with distributed imported and no other thread (none can want the lock): the server is
    # a fork of it, made here in milliseconds, outside the lock (a fork would hold it in every worker).
    with sigint_blocked_for_children():
        fork_self.start(env, WORKER_MODULES)
    _forked_environ(env)
    return _forkserver_thread  # never started: the server runs already


def _forked_environ(env: dict[str, str]) -> None:
    global _forkserver_environ
    _forkserver_environ = env


#: the name Dask's nanny gives its worker process (``distributed.nanny.WorkerProcess.start``)
NANNY_WORKER_PROCESS = "Dask Worker process (from Nanny)"


def _workers_skip_main() -> None:
    """A worker forked from our server does not run the user's script again as ``__mp_main__``.

    multiprocessing has every child it starts import the parent's main module
    (:func:`multiprocessing.spawn.get_preparation_data`), so that what the
    parent pickles by reference to ``__main__`` resolves in the child.  A Dask
    worker needs none of it: its target is distributed's own, and what a task
    brings from the script is pickled by value (cloudpickle pickles
    ``__main__``'s functions and classes so).  The import re-ran the script's
    top level in every worker (0.4-0.7 s of CPU each for a script that imports
    this package, before the worker could register: most of a script's wait
    for its first ``Pool`` result).  Only the nannies' worker processes of the
    fork server this process started drop it: every other child, of any start
    method, gets what multiprocessing gives it.
    """
    from multiprocessing import spawn

    original = spawn.get_preparation_data
    if getattr(original, "_jc_skips_main", False):
        return

    def get_preparation_data(name: str) -> dict[str, Any]:
        data = original(name)
        if name == NANNY_WORKER_PROCESS and _forkserver_thread is not None and _forkserver_method_in_use():
            data.pop("init_main_from_path", None)
            data.pop("init_main_from_name", None)
        return data

    get_preparation_data._jc_skips_main = True  # type: ignore[attr-defined]
    spawn.get_preparation_data = get_preparation_data


def _forkserver_method_in_use() -> bool:
    """Whether Dask starts worker processes from the fork server now (this process's setting)."""
    import dask.config

    return dask.config.get("distributed.worker.multiprocessing-method", None) == "forkserver"


def _server_environ() -> dict[str, str]:
    """This process's environment with what Dask's nanny adds for a worker's interpreter (``nanny._get_env_variables``).

    A variable set here wins over the setting, as in Dask; ``PYTHONHASHSEED``
    is fixed as the nanny fixes it, so that every worker hashes alike.
    """
    env = dict(os.environ)
    for k, v in (distributed_setting("distributed.nanny.pre-spawn-environ") or {}).items():
        if v is not None:
            env.setdefault(k, str(v))
    if env.get("PYTHONHASHSEED") in (None, "0"):
        env["PYTHONHASHSEED"] = "6640"
    return env


class _Spawned(subprocess.Popen):
    """A process that multiprocessing waits for (``ForkServer.ensure_running``), not this object.

    A ``Popen`` dropped while its process runs warns ("still running") and
    has the next ``Popen`` reap it, which multiprocessing would then miss.
    """

    def __del__(self) -> None:
        pass


@contextlib.contextmanager
def _spawning_with(env: dict[str, str]) -> Iterator[None]:
    """multiprocessing's fork server, started meanwhile, starts with ``env`` instead of this process's environment.

    multiprocessing has no way to give it an environment of its own, and
    setting this process's (for the moment of the start) would reach the
    notebook's other threads too: the one function it starts the server
    with is swapped for the same start with ``env``.
    """
    from multiprocessing import util

    original = util.spawnv_passfds

    def spawnv_passfds(path: Any, args: Any, passfds: Sequence[int]) -> int:
        if not any("multiprocessing.forkserver import main" in str(a) for a in args):
            return original(path, args, passfds)  # another thread's spawn meanwhile: as it would be
        # as util.spawnv_passfds does it (only ``passfds`` kept open, signals as they are), with ``env``
        return _Spawned(args, executable=path, pass_fds=passfds, env=env, restore_signals=False).pid

    util.spawnv_passfds = spawnv_passfds
    try:
        yield
    finally:
        util.spawnv_passfds = original


def environ_since_forkserver() -> dict[str, str]:
    """Variables set or changed in this process's environment since the fork server started.

    A forked worker inherits the server's environment, not the notebook's
    current one; the nannies set these in each worker before it runs anything.
    (A variable deleted meanwhile stays in the workers.)
    """
    if _forkserver_environ is None:
        return {}
    return {k: v for k, v in os.environ.items() if _forkserver_environ.get(k) != v}
