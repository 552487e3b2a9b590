"""A script's fork server as a fork of the script, once the script has imported distributed.

The local cluster's workers come from multiprocessing's fork server
(:mod:`.forkserver`): a fresh interpreter that imports distributed and this
package's worker modules, about a second of CPU on a small machine.  A script
(``import jupyter_cluster.multiprocessing as mp`` ... ``mp.Pool()``) has
imported all of that itself by the time its cluster starts, so the server is
made by forking the script instead: a few milliseconds, and no second import
on the first result's path (measured on 2 shared cores: see
``benchmarks/LOG.md``, issue 36).

Only where a fork is safe and the server would hold nothing of a notebook:
the main thread of a process with no other thread (a lock held by another
thread would stay held in every worker), not an IPython process, distributed
imported but none of its clients, clusters or connection pools made yet (a
script's first start), a ``/proc`` file system to find the loaded libraries
in, and ``jupyter-cluster.local.fork-script`` true.  The forked server is then made
to look like the spawned one to its workers:

- its copy of the "alive" pipe's write end is closed, so that it ends with
  the script as the spawned one does.  The script's other file descriptors
  stay open in it and its workers, as in every child of ``multiprocessing``'s
  "fork" method: objects inherited from the script (``sys.stderr`` under
  pytest's capture, a logging handler's file) write to them by number, and a
  number closed here would be reused by the descriptors a worker receives
  (seen: tracebacks written into the resource tracker's pipe);
- the environment is the one the spawned server gets (Dask's pre-spawn
  variables: ``OMP_NUM_THREADS=1`` ...); a BLAS library loaded already
  (numpy's OpenBLAS, MKL) is told its thread count, and glibc its trim
  threshold, which they read only when loaded;
- numpy's global random generator, when the script has imported
  ``numpy.random``, is seeded afresh in each worker (``random`` is, by
  Python): forked workers would otherwise draw the same numbers;
- the objects inherited from the script are frozen out of the cyclic garbage
  collector, so that none is finalised in the server (closing a descriptor
  number that was reused meanwhile, say).

What differs from a spawned server: workers hash strings with the script's
hash seed (alike in every worker of the cluster, as Dask's fixed
``PYTHONHASHSEED`` makes them; a worker started elsewhere for this scheduler
hashes differently), and a worker has the script's modules and ``__main__``
loaded (the part above the ``__main__`` guard had run; workers never run it
again).
"""

from __future__ import annotations

import gc
import os
import socket
import sys
import threading
from typing import Any, NoReturn

from ... import config


def possible() -> bool:
    """Whether the fork server may be made by forking this process now (see the module's text)."""
    return (
        bool(config.get("local.fork-script", True))
        and hasattr(os, "fork")
        and os.path.isfile("/proc/self/maps")
        and threading.current_thread() is threading.main_thread()
        and threading.active_count() == 1
        and "distributed" in sys.modules
        and "IPython" not in sys.modules
        and _no_dask_objects()
    )


def _no_dask_objects() -> bool:
    """No client, cluster or connection pool of distributed exists in this process yet.

    A worker forked from a process that had one would hold it too: a default
    client that ``worker_client()`` found instead of its worker's (seen: a
    map's nested submit waited forever, in a pytest process that had run
    clusters before), a pool's connections.  A script's first start has none.
    """
    from distributed.client import Client
    from distributed.core import ConnectionPool
    from distributed.deploy.spec import SpecCluster

    return not (len(Client._instances) or len(ConnectionPool._instances) or len(SpecCluster._instances))


def start(env: dict[str, str], preload: list[str]) -> int:
    """Fork this process into multiprocessing's fork server; returns its pid.

    What :meth:`multiprocessing.forkserver.ForkServer.ensure_running` does,
    with a fork of this process where it spawns an interpreter: the same
    0600 listening socket, the same "alive" pipe, the same attributes set on
    multiprocessing's server object, so that every process start afterwards
    (the nannies', a ``forkserver`` context's) goes to it.  Called only when
    :func:`possible` (one thread: nothing can take multiprocessing's lock
    meanwhile).
    """
    import importlib
    from multiprocessing import connection, forkserver, resource_tracker
    from multiprocessing import util as mp_util

    # multiprocessing's own helpers and its server object's attributes (private: typed loosely)
    conn: Any = connection
    util: Any = mp_util
    server: Any = getattr(forkserver, "_forkserver")  # noqa: B009
    for name in preload:  # imported already in a script that got here; a worker needs them
        importlib.import_module(name)
    resource_tracker.ensure_running()  # as ensure_running does first: the workers share this one
    address = conn.arbitrary_address("AF_UNIX")
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(address)
        if not util.is_abstract_socket_namespace(address):
            os.chmod(address, 0o600)
        listener.listen()
        alive_r, alive_w = os.pipe()
        try:
            util._flush_std_streams()  # else both processes write what is buffered
            pid = os.fork()
            if pid == 0:
                os.close(alive_w)
                _serve(listener.fileno(), alive_r, env)
        except BaseException:
            os.close(alive_w)
            raise
        finally:
            os.close(alive_r)
    server._forkserver_address = address
    server._forkserver_alive_fd = alive_w
    server._forkserver_pid = pid
    return pid


def _serve(listener_fd: int, alive_r: int, env: dict[str, str]) -> NoReturn:
    """The forked server's life: multiprocessing's fork server loop, then exit without the script's clean-up."""
    code = 1
    try:
        gc.freeze()  # the script's objects: never finalised here (see the module's text)
        os.environ.clear()
        os.environ.update(env)
        _native_settings(env)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_fresh_numpy_random)
        from multiprocessing import forkserver

        # preload=[]: everything a worker needs is imported; no main_path: the script is not run again
        forkserver.main(listener_fd, alive_r, [])
        code = 0
    except SystemExit:  # the script has gone (the "alive" pipe's end): the server's normal end
        code = 0
    except BaseException:  # noqa: BLE001 - said on stderr; the nannies report their failed starts
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


def _native_settings(env: dict[str, str]) -> None:
    """Apply what native libraries read from the environment only when they load (Dask's pre-spawn variables)."""
    import ctypes

    threads = env.get("OPENBLAS_NUM_THREADS") or env.get("OMP_NUM_THREADS")
    mkl_threads = env.get("MKL_NUM_THREADS") or env.get("OMP_NUM_THREADS")
    trim = env.get("MALLOC_TRIM_THRESHOLD_")
    try:
        with open("/proc/self/maps") as f:
            libraries = {line.split()[-1] for line in f if ".so" in line}
    except OSError:
        return
    for path in libraries:
        name = os.path.basename(path)
        calls: list[tuple[str, tuple[int, ...]]] = []  # the first symbol the library has is called
        if "openblas" in name and threads:
            calls = [(symbol, (int(threads),)) for symbol in _OPENBLAS_SET_THREADS]
        elif name.startswith("libmkl_rt") and mkl_threads:
            calls = [("MKL_Set_Num_Threads", (int(mkl_threads),))]
        elif name.startswith("libc.so") and trim:
            calls = [("mallopt", (_M_TRIM_THRESHOLD, int(trim)))]
        for symbol, args in calls:
            try:
                function = getattr(ctypes.CDLL(path), symbol)
            except (OSError, AttributeError):
                continue
            function(*args)
            break


#: the thread-count setter of each OpenBLAS build numpy and scipy ship (plain, and their 64-bit-int symbols)
_OPENBLAS_SET_THREADS = (
    "openblas_set_num_threads",
    "openblas_set_num_threads64_",
    "scipy_openblas_set_num_threads64_",
    "scipy_openblas_set_num_threads",
)
#: glibc's ``mallopt`` parameter for ``MALLOC_TRIM_THRESHOLD_``
_M_TRIM_THRESHOLD = -1


def _fresh_numpy_random() -> None:
    """In each worker: numpy's global generator seeded afresh, as a newly imported numpy.random would be."""
    module = sys.modules.get("numpy.random")
    if module is not None:
        try:
            module.seed()
        except Exception:  # noqa: BLE001 - a numpy without the legacy generator: nothing shared to reseed
            pass
