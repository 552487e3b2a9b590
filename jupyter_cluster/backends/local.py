"""Local clusters: ``distributed.LocalCluster`` with worker processes on loopback.

Two variants beyond the plain one:

* ``gpus=True`` (``%cluster start --gpus``): one worker per visible GPU, each
  pinned to its device with ``CUDA_VISIBLE_DEVICES`` and advertising the Dask
  resource ``GPU=1`` — through dask-cuda's ``LocalCUDACluster`` when it is
  installed, else a ``SpecCluster`` of nannies with per-worker environments.
* ``tls=True`` (``--tls``): Dask's temporary TLS credentials.  With the default
  ``jupyter-cluster.local.tls: auto`` a scheduler bound to anything but
  loopback uses TLS.  The credentials are saved (mode 0600) beside the
  cluster's registry record so other processes of the same user — another
  kernel's ``%cluster connect NAME``, the Jupyter server's panel — can attach
  (:func:`jupyter_cluster.credentials.saved_security`).
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import types
import uuid
import weakref
from typing import Any

from distributed import WorkerPlugin

from .. import config
from ..credentials import forget_security, new_security, written_identity
from ..errors import ClusterError
from . import Backend, StartedCluster

GPU_RESOURCE = "GPU"


def default_workers() -> int:
    """Workers a local cluster starts with by default: one per CPU this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


WORKERS_PER_CORE = 16
WORKER_MEMORY = 150 * 2**20  # what an idle worker process takes, roughly


def max_local_workers() -> int:
    """The most worker processes a local cluster may start on this machine."""
    import psutil

    by_memory = psutil.virtual_memory().total // WORKER_MEMORY
    return int(max(1, min(WORKERS_PER_CORE * default_workers(), by_memory)))


# -- GPUs ----------------------------------------------------------------------
def _split_devices(value: Any) -> list[str]:
    if isinstance(value, (list, tuple)):
        items = [str(v) for v in value]
    else:
        items = str(value).split(",")
    return [d.strip() for d in items if d.strip()]


def visible_gpus() -> list[str]:
    """Device ids of the GPUs this process may use, in order.

    ``jupyter-cluster.local.gpu-devices`` (a list, or "0,1") wins when set — it
    lets tests and administrators name devices without probing hardware.  Then
    ``CUDA_VISIBLE_DEVICES`` (which CUDA itself honours; "" or "-1" means none),
    then ``nvidia-smi``.
    """
    configured = config.get("local.gpu-devices")
    if configured is not None:
        return _split_devices(configured)
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        devices = _split_devices(env)
        return [] if devices in ([], ["-1"]) else devices
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run(
            [smi, "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return _split_devices(out.stdout.replace("\n", ",")) if out.returncode == 0 else []


def select_gpus(gpus: Any) -> list[str]:
    """The devices ``--gpus`` asks for: all visible ones (True/"all") or a listed subset."""
    visible = visible_gpus()
    if not visible:
        raise ClusterError(
            "this machine has no visible GPUs (nvidia-smi found none and CUDA_VISIBLE_DEVICES names none), "
            "so --gpus cannot start GPU workers; leave out --gpus to use CPU workers."
        )
    if gpus is True or str(gpus).lower() in ("all", "true"):
        return visible
    wanted = _split_devices(gpus)
    unknown = [d for d in wanted if d not in visible]
    if unknown or not wanted or len(set(wanted)) != len(wanted):
        raise ClusterError(
            f"--gpus {gpus} does not name distinct visible GPUs; the visible ones are {', '.join(visible)}."
        )
    return wanted


def gpu_worker_specs(devices: list[str], threads: int, memory_limit: Any, host: str, security: Any) -> dict[str, dict]:
    """``SpecCluster`` worker specs: one nanny per device, pinned and advertising ``GPU=1``.

    The pin is an environment variable of the worker process, so it is in
    place before anything in the worker can initialise CUDA.
    """
    from distributed import Nanny

    specs = {}
    for device in devices:
        options: dict[str, Any] = {
            "nthreads": threads,
            "memory_limit": memory_limit,
            "host": host,
            "env": {"CUDA_VISIBLE_DEVICES": device},
            "resources": {GPU_RESOURCE: 1},
            "name": f"gpu-{device}",
        }
        if security is not None:
            options["security"] = security
        specs[f"gpu-{device}"] = {"cls": Nanny, "options": options}
    return specs


def _cuda_cluster_class():
    try:
        from dask_cuda import LocalCUDACluster
    except ImportError:
        return None
    return LocalCUDACluster


# -- TLS -------------------------------------------------------------------------
def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def wants_tls(tls: Any, host: str) -> bool:
    """Resolve ``tls`` (True, False or "auto") for a scheduler bound to ``host``."""
    if isinstance(tls, str):
        if tls.lower() == "auto":
            return not _is_loopback(host)
        return tls.lower() in ("true", "yes", "1")
    return bool(tls)


# -- dashboard -------------------------------------------------------------------------
def dashboard_on_unix_socket(cluster: Any) -> str:
    """Move the scheduler's dashboard from its TCP port to a Unix socket only this user can open.

    A loopback port is open to every user of the machine; a socket in a fresh
    0700 folder is not.  Browsers reach it through the Jupyter server, behind
    its authentication (:mod:`jupyter_cluster.server.dashboard`).  The
    scheduler runs in this process (local clusters), so its HTTP server is
    rebound on its own event loop.  Returns the socket's path.
    """
    from tornado.netutil import bind_unix_socket

    folder = tempfile.mkdtemp(prefix="jupyter-cluster-")  # 0700; short, as socket paths must be (< 108 bytes)
    path = os.path.join(folder, "dashboard.sock")

    async def rebind() -> None:
        server = cluster.scheduler.http_server
        server.stop()
        server.add_socket(bind_unix_socket(path, mode=0o600))

    cluster.sync(rebind)
    return path


def parent_server_base_url() -> str:
    """Base URL of the Jupyter server this kernel runs under ("/" if none; JupyterHub's prefix if set).

    Read from the servers' runtime files (``jpserver-<pid>.json``) without
    importing jupyter_server, whose ``serverapp`` module took 1.2 s of a 2.2 s
    first ``%cluster start``.  A file counts only when its pid is an ancestor
    of this process, which also proves that server still runs.
    """
    import glob
    import json

    import psutil
    from jupyter_core.paths import jupyter_runtime_dir

    try:
        ancestors = {p.pid for p in psutil.Process().parents()}
        files = glob.glob(os.path.join(jupyter_runtime_dir(), "jpserver-*.json"))
    except (OSError, psutil.Error):
        ancestors, files = set(), []
    for path in files:
        try:
            with open(path, encoding="utf-8") as f:
                info = json.load(f)
        except (OSError, ValueError):  # being written, or removed meanwhile
            continue
        if isinstance(info, dict) and info.get("pid") in ancestors:
            return str(info.get("base_url") or "/")
    return os.environ.get("JUPYTERHUB_SERVICE_PREFIX") or "/"


def _remove_dashboard_socket(path: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(path)
    with contextlib.suppress(OSError):
        os.rmdir(os.path.dirname(path))


# -- backend -----------------------------------------------------------------------
def _sentence(exc: BaseException) -> str:
    """An exception's message ending in one full stop (Dask's "Nanny failed to start." has one)."""
    text = str(exc).strip() or type(exc).__name__
    return text if text.endswith((".", "!", "?")) else text + "."


def _os_error_in(exc: BaseException | None) -> OSError | None:
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, OSError):
            return exc
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def _keep_nannies() -> None:
    """Stop LocalCluster from dropping the nanny of a worker that keeps dying.

    A SpecCluster closes a worker's nanny for good when the worker is missing
    ``distributed.deploy.lost-worker-timeout`` (15 s) after it died.  An item
    that keeps crashing workers (a "poison pill") then leaves the cluster with
    no workers, and maps hang.  Nannies restart their workers themselves, so
    the clean-up may wait much longer.  Only Dask's default is replaced (set
    globally: the check reads the config when a worker is lost, long after
    start); a value the user chose is kept.
    """
    import dask.config

    key = "distributed.deploy.lost-worker-timeout"
    if dask.config.get(key, None) == "15s":
        dask.config.set({key: "1h"})


def _slower_ticks() -> None:
    """Let Dask's servers check their event loop 5 times a second instead of 50.

    Every Dask server (the scheduler and, in a local cluster, each nanny in
    the notebook's process; each worker in its own) runs a callback every
    ``distributed.admin.tick.interval`` (20 ms) that only measures whether
    the loop was blocked, to warn past ``tick.limit`` (3 s).  On 2 cores those
    callbacks were 60 % of an idle cluster's CPU (0.09 → 0.03 cores with
    200 ms), time that CPU-bound items lose.  Only Dask's default is replaced;
    a value the user chose is kept.
    """
    import dask.config

    key = "distributed.admin.tick.interval"
    if dask.config.get(key, None) == "20ms":
        dask.config.set({key: "200ms"})


@contextlib.contextmanager
def sigint_blocked_for_children():
    """Block SIGINT in this thread, and so in every thread and process it starts.

    JupyterLab's stop button sends SIGINT to the kernel's whole process group,
    which holds the local worker processes too; they must not die from it.  A
    signal mask is inherited by new threads and kept across ``fork`` and
    ``exec``, so the cluster's event-loop thread (created inside this block)
    starts every worker process - at start, on scale-up, on restart - with
    SIGINT already blocked, before its first Python instruction: there is no
    start-up window.  The kernel's main thread gets its own mask back on exit,
    so the stop button still interrupts the cell (Python raises KeyboardInterrupt
    in the main thread whichever thread takes the signal, even inside the
    block; :meth:`LocalBackend.start` then closes the half-made cluster).
    SIGTERM, which Dask uses to stop workers, is untouched.
    """
    if not hasattr(signal, "pthread_sigmask"):  # Windows: no process-group interrupts there
        yield
        return
    # multiprocessing starts its resource tracker lazily, and *unblocks* SIGINT in
    # the thread that starts it; start it now, outside the block.
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


# -- scripts: worker processes import the main module ------------------------------------
GUARD_FIX = 'put the code that starts it under `if __name__ == "__main__":`'


def main_imported_by_workers() -> str | None:
    """The script (or module) each new worker process imports as ``__mp_main__``; None if none.

    A spawned or fork-served worker re-imports the parent's main module, as
    :mod:`multiprocessing.spawn` decides: a file script or a ``python -m``
    module, but not ``python -c``, stdin, a package's ``__main__`` or IPython.
    """
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name is not None:
        if name == "__main__" or name.endswith(".__main__"):
            return None
        return getattr(main, "__file__", None) or name
    path = getattr(main, "__file__", None)
    if path is None or os.path.splitext(os.path.basename(path))[0] == "ipython":
        return None
    return os.path.abspath(path)


#: what a test on ``__name__`` tells of the script: true only when run as the main script, or true
#: whenever it is imported (as the workers do, under the name "__mp_main__")
_MAIN, _IMPORTED = "main", "imported"


def _main_test(test: Any) -> str | None:
    """Whether ``test`` holds only in the main script (``_MAIN``), whenever imported (``_IMPORTED``), or neither.

    Knows the forms users write: ``__name__ == "__main__"`` either way round,
    ``!=``, ``in`` / ``not in`` a literal tuple, list or set, ``not``, and
    ``and`` / ``or`` of such tests with anything else.
    """
    import ast

    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _main_test(test.operand)
        return {_MAIN: _IMPORTED, _IMPORTED: _MAIN}.get(inner) if inner else None
    if isinstance(test, ast.BoolOp):
        kinds = [_main_test(value) for value in test.values]
        # `and`: one main-only operand makes it main-only; `or`: one always-true-when-imported does
        one, every = (_MAIN, _IMPORTED) if isinstance(test.op, ast.And) else (_IMPORTED, _MAIN)
        if one in kinds:
            return one
        return every if all(k == every for k in kinds) else None
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return None
    left, right, op = test.left, test.comparators[0], test.ops[0]
    if isinstance(op, (ast.Eq, ast.NotEq)):
        sides = [left, right]
        if not (
            any(isinstance(x, ast.Name) and x.id == "__name__" for x in sides)
            and any(isinstance(x, ast.Constant) and x.value == "__main__" for x in sides)
        ):
            return None
        return _MAIN if isinstance(op, ast.Eq) else _IMPORTED
    if isinstance(op, (ast.In, ast.NotIn)) and isinstance(left, ast.Name) and left.id == "__name__":
        if not isinstance(right, (ast.Tuple, ast.List, ast.Set)):
            return None
        values = {x.value for x in right.elts if isinstance(x, ast.Constant)}
        if len(values) != len(right.elts) or "__main__" not in values or "__mp_main__" in values:
            return None
        return _MAIN if isinstance(op, ast.In) else _IMPORTED
    return None


def _lines(nodes: list[Any]) -> tuple[int, int]:
    return nodes[0].lineno, nodes[-1].end_lineno or nodes[-1].lineno


def _ends_import(body: list[Any]) -> bool:
    """Whether a block ends by leaving the module: ``raise``, ``sys.exit()``, ``exit()``, ``quit()``, ``os._exit()``."""
    import ast

    last = body[-1]
    if isinstance(last, ast.Raise):
        return True
    call = last.value if isinstance(last, ast.Expr) else None
    if not isinstance(call, ast.Call):
        return False
    func = call.func
    if isinstance(func, ast.Name):
        return func.id in ("exit", "quit")
    return (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and (func.value.id, func.attr) in (("sys", "exit"), ("os", "_exit"))
    )


def _script_guards(path: str) -> tuple[list[tuple[int, int]], list[int]] | None:
    """What of a script runs only as the main script, and where its import ends; None if unreadable.

    Returns the line ranges that run only when the script is the main one (the
    body of ``if __name__ == "__main__":`` and of its other forms, the
    ``else:`` of ``if __name__ != "__main__":``, what follows a main-only test
    in an ``and``, a ``match __name__: case "__main__":``) and the lines, run
    at import, that end an import of the script (``if __name__ != "__main__":
    sys.exit()``): the workers, which import it, would end there.
    """
    import ast
    import tokenize

    try:
        with tokenize.open(path) as f:
            source = f.read()
    except (OSError, SyntaxError, ValueError):
        return None
    tree = None
    for _ in range(3):
        try:
            tree = ast.parse(source, path)
            break
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None
        except SystemError:
            # CPython 3.11 keeps ast.parse's recursion count per interpreter, so a parse in another
            # thread at the same moment can fail this one ("AST constructor recursion depth
            # mismatch", seen once when starting 16 workers); it is not about the script: try again.
            continue
    if tree is None:
        return None  # cannot tell: the check never blocks a script it could not read
    guarded: list[tuple[int, int]] = []
    ends: list[int] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.IfExp)):
            kind = _main_test(node.test)
            branch = node.body if kind == _MAIN else node.orelse if kind == _IMPORTED else None
            if branch:
                guarded.append(_lines(branch if isinstance(branch, list) else [branch]))
        elif isinstance(node, ast.BoolOp):
            stop = _MAIN if isinstance(node.op, ast.And) else _IMPORTED  # where evaluation stops in a worker
            kinds = [_main_test(value) for value in node.values]
            if stop in kinds[:-1]:
                guarded.append(_lines(node.values[kinds.index(stop) + 1 :]))
        elif isinstance(node, ast.Match) and isinstance(node.subject, ast.Name) and node.subject.id == "__name__":
            for case in node.cases:
                pattern = case.pattern
                if isinstance(pattern, ast.MatchValue) and getattr(pattern.value, "value", None) == "__main__":
                    guarded.append(_lines(case.body))

    def at_import(block: list[Any]) -> None:
        # statements that run when the module is imported: not those in a function's body
        for stmt in block:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if isinstance(stmt, ast.If):
                kind = _main_test(stmt.test)
                # the branch a worker's import takes, whatever else holds
                branch = stmt.body if kind == _IMPORTED else stmt.orelse if kind == _MAIN else []
                if branch and _ends_import(branch):
                    ends.append(branch[-1].lineno)
            for child in ast.iter_child_nodes(stmt):
                if isinstance(child, (ast.ExceptHandler, ast.match_case)):
                    at_import(child.body)
            for name in ("body", "orelse", "finalbody"):
                inner = getattr(stmt, name, None)
                if isinstance(inner, list):
                    at_import(inner)

    at_import(tree.body)
    ends = [n for n in ends if not any(first <= n <= last for first, last in guarded)]
    return guarded, ends


def check_main_guard(processes: bool | None) -> None:
    """Refuse to start worker processes from a main script's unguarded top-level code.

    Each worker imports the script (see :func:`main_imported_by_workers`), so
    code at its top level that starts a cluster would start one in every
    worker, which multiprocessing refuses with pages of tracebacks.  In such a
    worker (still importing it: multiprocessing's ``_inheriting``) this exits
    the process with one line on stderr; in the script's own process it
    raises :class:`ClusterError` before anything starts, when the call comes
    from a top-level line outside an ``if __name__ == "__main__":`` block (or
    another form of it, see :func:`_script_guards`), or when the script ends
    its own import by the workers (``if __name__ != "__main__": sys.exit()``).
    """
    if processes is False:
        return
    import multiprocessing

    if getattr(multiprocessing.current_process(), "_inheriting", False):
        # One line per worker, not a traceback each: they would bury the script's own error.
        sys.stderr.write(
            f"jupyter_cluster: a worker process imported the main script, which starts a cluster; {GUARD_FIX}.\n"
        )
        sys.stderr.flush()
        raise SystemExit(1)
    main = sys.modules.get("__main__")
    if main is None:
        return
    path = getattr(main, "__file__", None)
    if path is not None and getattr(main, "__spec__", None) is None:
        from multiprocessing import process

        if not os.path.isfile(os.path.join(getattr(process, "ORIGINAL_DIR", None) or "", path)):
            # `python - < script.py` names its main "<stdin>", which multiprocessing would make
            # every worker run as a file and fail to find; without a name they import nothing.
            del main.__file__
    script = main_imported_by_workers()
    path = getattr(main, "__file__", None)
    if script is None or path is None:
        return
    path = os.path.abspath(path)
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None and not (
        frame.f_code.co_name == "<module>"
        and frame.f_globals is vars(main)
        and os.path.abspath(frame.f_code.co_filename) == path
    ):
        frame = frame.f_back
    if frame is None:  # not called from the script's top level (from a thread, say): the workers report it
        return
    found = _script_guards(path)
    if found is None:
        return
    guarded, ends = found
    if ends:  # the workers' import of the script ends there, before any of them can start
        raise ClusterError(
            f"the worker processes import this script ({script}) and line {ends[0]} ends that import "
            f"(it exits when the script is not the main one), so no worker can start; instead, {GUARD_FIX}."
        )
    if any(first <= frame.f_lineno <= last for first, last in guarded):
        return
    raise ClusterError(
        f"the worker processes import this script ({script}) and line {frame.f_lineno} starts a cluster "
        f"when it is imported; {GUARD_FIX}."
    )


# -- worker processes from a fork server ------------------------------------------------
def _forkserver_is_private() -> bool:
    """Whether multiprocessing's fork server listens where only this user can connect.

    Before Python 3.10.9 / 3.11.1 it listened on a Linux abstract socket, which
    any local user could use to run code as us (CVE-2022-42919); since, on a
    0600 socket file in a 0700 folder.
    """
    version = sys.version_info[:3]
    return (3, 10, 9) <= version < (3, 11) or version >= (3, 11, 1)


#: what the fork server imports for every worker: distributed, and what of ours runs on a worker
WORKER_MODULES = ["distributed", "jupyter_cluster.backends.local"]

_forkserver_lock = threading.Lock()
#: this process's environment when it started the fork server (None: it did not start one)
_forkserver_environ: dict[str, str] | None = None
_forkserver_thread: threading.Thread | None = None


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
    method = dask.config.get(key, None)
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
    global _forkserver_thread
    import multiprocessing

    import dask.config
    import distributed.utils

    with _forkserver_lock:
        if _forkserver_thread is not None and (_forkserver_thread.is_alive() or _forkserver_environ is not None):
            return _forkserver_thread  # started (or starting) already; the server itself is checked by the nannies
        pre_spawn = dask.config.get("distributed.nanny.pre-spawn-environ") or {}
        env = {k: str(v) for k, v in pre_spawn.items() if v is not None}
        env.setdefault("PYTHONHASHSEED", "6640")  # as the nanny sets it: the same hashing in every worker
        for k, v in env.items():
            os.environ.setdefault(k, v)
        # distributed's own preload list (set by its first get_mp_context) also imports numpy
        # and pandas into the notebook's process; ours is WORKER_MODULES.
        if not getattr(distributed.utils, "_forkserver_preload_set", False):
            multiprocessing.get_context("forkserver").set_forkserver_preload(WORKER_MODULES)
            distributed.utils._forkserver_preload_set = True

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


def _ignore_sigint() -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


class IgnoreSigint(WorkerPlugin):
    """Worker plugin: a worker process ignores SIGINT for good.

    Workers start with SIGINT blocked (:func:`sigint_blocked_for_children`);
    a blocked signal stays pending and would be delivered to any thread that
    unblocks it later (multiprocessing's resource tracker does so when a task
    first uses it).  Ignoring it drops it whichever thread would get it.
    """

    idempotent = True
    name = "jupyter-cluster-ignore-sigint"

    def setup(self, worker) -> None:
        loop = getattr(worker, "loop", None)
        if threading.current_thread() is threading.main_thread() or loop is None:
            _ignore_sigint()
        else:
            loop.add_callback(_ignore_sigint)


class NoWorkerHttp(WorkerPlugin):
    """Worker plugin: the worker's HTTP server (Prometheus metrics, health) stops listening on TCP.

    Like the scheduler's dashboard (:func:`dashboard_on_unix_socket`), a
    loopback port would be open to every user of the machine; nothing of a
    local cluster needs the workers' HTTP servers.
    """

    idempotent = True
    name = "jupyter-cluster-no-worker-http"

    def setup(self, worker) -> None:
        server = getattr(worker, "http_server", None)
        if server is not None:
            worker.loop.add_callback(server.stop)


#: how long a closing worker waits for the heartbeat it has in flight (seconds); one to a live
#: scheduler returns in milliseconds, even on a loaded machine, and the nanny allows the close ~5 s
HEARTBEAT_GRACE = 2.0


class QuietWorker(WorkerPlugin):
    """Worker plugin: a worker closes without logging an error of its own making.

    A heartbeat still in flight when ``Worker.close`` closes its connection pool fails
    with ``CommClosedError: ConnectionPool closing`` and Dask logs it as an error with
    a traceback ("Failed to communicate with scheduler during heartbeat", or
    "Unexpected exception during heartbeat" once the pool is closed) on the terminal of
    the script or kernel whose cluster stops -- on a loaded machine, where a heartbeat
    takes long enough to overlap the close.  The worker here starts no heartbeat once
    it is closing, and its close (this plugin's teardown, which runs before the pool
    closes) stops the heartbeat callback and waits for the one in flight, for at most
    :data:`HEARTBEAT_GRACE` seconds.
    """

    idempotent = True
    name = "jupyter-cluster-quiet-worker"

    def setup(self, worker) -> None:
        import asyncio

        from distributed.worker import WORKER_ANY_RUNNING

        pc = getattr(worker, "periodic_callbacks", {}).get("heartbeat")
        if pc is None or getattr(worker, "_jc_heartbeat_idle", None) is not None:
            return
        beat = pc.callback
        idle = asyncio.Event()
        idle.set()

        async def heartbeat() -> None:
            if worker.status not in WORKER_ANY_RUNNING:
                return  # closing: its connection pool is about to close under it
            idle.clear()
            try:
                await beat()
            finally:
                idle.set()

        pc.callback = heartbeat
        worker._jc_heartbeat_idle = idle

    async def teardown(self, worker) -> None:
        import asyncio

        pc = getattr(worker, "periodic_callbacks", {}).get("heartbeat")
        if pc is not None:
            pc.stop()  # Worker.close stops it too, but only after its pool may be closing
        idle = getattr(worker, "_jc_heartbeat_idle", None)
        if idle is not None:
            with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                await asyncio.wait_for(idle.wait(), HEARTBEAT_GRACE)


def _close_quietly(cluster: Any, wait_for_start: bool = False) -> None:
    """Close ``cluster`` and its workers, also one whose start was interrupted half-way."""
    import time

    deadline = time.monotonic() + (60 if wait_for_start else 0)
    # A cluster still starting ignores close(); its start goes on in its event loop thread.
    while (
        getattr(getattr(cluster, "status", None), "name", "running") in ("created", "starting")
        and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    try:
        cluster.close(timeout=30)
    except Exception:  # half-started: closing must still finish
        pass


class LocalBackend(Backend):
    """One single-threaded worker process per core, bound to 127.0.0.1 by default."""

    name = "local"
    options = ("name", "workers", "threads", "memory_limit", "port", "host", "tls", "processes", "gpus")

    def prepare(self, processes: bool | None = None, gpus: Any = None, **options: Any) -> None:
        """Start the fork server the workers will come from (see :func:`use_forkserver`)."""
        check_main_guard(processes)
        if processes is not False and gpus in (None, False) and use_forkserver():
            start_forkserver()

    @staticmethod
    def max_workers() -> int:
        """The most worker processes this machine can run (see :func:`max_local_workers`)."""
        return max_local_workers()

    def start(
        self,
        name: str | None = None,
        workers: int | None = None,
        threads: int | None = None,
        memory_limit: str | int | None = None,
        port: int | None = None,
        host: str | None = None,
        tls: bool | str | None = None,
        processes: bool | None = None,
        gpus: Any = None,
        **options: Any,
    ) -> StartedCluster:
        self.check_options(options)
        check_main_guard(processes)
        from distributed import LocalCluster

        _keep_nannies()
        _slower_ticks()
        devices = select_gpus(gpus) if gpus not in (None, False) else None
        if devices is not None and workers is not None and workers != len(devices):
            raise ClusterError(
                f"--gpus starts one worker per GPU ({len(devices)} here), so it cannot be combined with --workers {workers}; "
                "pick devices with --gpus 0,1 instead."
            )
        if devices is not None and processes is False:
            raise ClusterError("--gpus needs worker processes (each pinned to its GPU); leave out processes=False.")
        workers = (
            workers
            if workers is not None
            else (len(devices) if devices is not None else (config.get("local.workers") or default_workers()))
        )
        threads = threads if threads is not None else config.get("local.threads")
        memory_limit = memory_limit if memory_limit is not None else config.get("local.memory-limit")
        host = host or config.get("local.host")
        tls = wants_tls(config.get("local.tls") if tls is None else tls, host)
        if workers < 0 or threads < 1:
            raise ClusterError("--workers must be 0 or more and --threads 1 or more.")
        limit = max_local_workers()
        if workers > limit:
            raise ClusterError(
                f"--workers {workers} is more worker processes than this machine can run (at most {limit}: "
                f"{WORKERS_PER_CORE} per core and {WORKER_MEMORY // 2**20} MiB of memory each); ask for fewer, or use a multi-machine backend."
            )
        if port is not None and not (isinstance(port, int) and 0 <= port <= 65535):
            raise ClusterError(f"--port must be a TCP port from 0 to 65535 (0 or none picks a free one), not {port}.")
        kwargs: dict[str, Any] = dict(
            n_workers=workers,
            threads_per_worker=threads,
            memory_limit=memory_limit,
            host=host,
            scheduler_port=port or 0,
            dashboard_address=config.get("local.dashboard-address"),
            processes=True if processes is None else processes,
            name=name,
        )
        security = None
        cred_name = name or f"unnamed-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        identity = None  # which credential files are this cluster's (the name may be reused after it stops)
        if tls:
            security = new_security(cred_name)
            identity = written_identity(cred_name)
            kwargs["security"] = security
            kwargs["protocol"] = "tls://"
        cluster = None
        from distributed.deploy.spec import SpecCluster

        existing = set(SpecCluster._instances)
        plugins = (
            [QuietWorker()]
            + ([IgnoreSigint()] if kwargs["processes"] else [])
            + ([NoWorkerHttp()] if security is not None else [])
        )
        if devices is None:
            # Each worker installs them before it registers with the scheduler (also after a
            # restart, and on scale-up): no window, and no round trip to every worker at start.
            kwargs["plugins"] = tuple(plugins)
        if devices is None and kwargs["processes"] and use_forkserver():
            kwargs["env"] = environ_since_forkserver()  # {} before the server's first start
            start_forkserver()  # the nannies' first process start waits for it (multiprocessing's lock)
        try:
            with sigint_blocked_for_children():
                if devices is None:
                    cluster = LocalCluster(**kwargs)
                else:
                    cluster = self._start_gpu_cluster(devices, kwargs, security)
        except (OSError, RuntimeError) as exc:
            # distributed wraps a failed bind in RuntimeError("Cluster failed to start"); find the cause.
            cause = _os_error_in(exc)
            if (
                port
                and cause is not None
                and (cause.errno == errno.EADDRINUSE or "address already in use" in str(cause).lower())
            ):
                raise ClusterError(
                    f"port {port} is already taken on {host}; pick another --port or leave it out to use a free one."
                ) from None
            raise ClusterError(f"the local cluster could not start: {_sentence(cause or exc)}") from exc
        except ValueError as exc:
            raise ClusterError(f"the local cluster could not start: {_sentence(exc)}") from None
        except BaseException:
            # The stop button pressed during start-up: Python raises KeyboardInterrupt in the main
            # thread wherever it is, even inside LocalCluster() (whose object we then never get).
            # Close whatever cluster this call began, once it has finished starting.
            for started in [cluster] if cluster is not None else set(SpecCluster._instances) - existing:
                _close_quietly(started, wait_for_start=True)
            raise
        finally:
            if security is not None and cluster is None:
                forget_security(cred_name, identity)
        try:
            return self._finish(cluster, security, cred_name, identity, [] if devices is None else plugins)
        except BaseException:
            _close_quietly(cluster)
            if security is not None:
                forget_security(cred_name, identity)
            raise

    @staticmethod
    def _finish(
        cluster: Any, security: Any, cred_name: str, identity: tuple[int, int, int] | None, to_register: list
    ) -> StartedCluster:
        cleanup = []
        extra: dict[str, Any] = {}
        dashboard_link = cluster.dashboard_link
        if security is not None:
            cleanup.append(lambda: forget_security(cred_name, identity))
            # a cluster dropped without stop; the collector may get to it after a newer cluster took its name
            weakref.finalize(cluster, forget_security, cred_name, identity)
            if (
                getattr(cluster, "scheduler", None) is not None
                and getattr(cluster.scheduler, "http_server", None) is not None
            ):
                from ..server.dashboard import link

                sock = dashboard_on_unix_socket(cluster)
                cleanup.append(lambda: _remove_dashboard_socket(sock))
                weakref.finalize(cluster, _remove_dashboard_socket, sock)
                extra["dashboard_socket"] = sock
                dashboard_link = link(parent_server_base_url(), cred_name)
        return StartedCluster(
            address=cluster.scheduler_address,
            dashboard_link=dashboard_link,
            cluster=cluster,
            security=security,
            worker_plugins=to_register,
            cleanup=cleanup,
            extra=extra,
        )

    @staticmethod
    def _start_gpu_cluster(devices: list[str], kwargs: dict[str, Any], security: Any):
        CUDACluster = _cuda_cluster_class()
        if CUDACluster is not None:
            # dask-cuda also sets up device memory limits and UCX where present;
            # it orders CUDA_VISIBLE_DEVICES per worker so each worker's first
            # device is its own.
            kwargs = {k: v for k, v in kwargs.items() if k != "processes"}
            return CUDACluster(CUDA_VISIBLE_DEVICES=",".join(devices), resources={GPU_RESOURCE: 1}, **kwargs)
        from distributed import Scheduler, SpecCluster
        from distributed.system import MEMORY_LIMIT

        memory_limit = kwargs["memory_limit"]
        if memory_limit == "auto":  # as LocalCluster does: split the machine between the workers
            memory_limit = MEMORY_LIMIT // max(1, len(devices))
        scheduler_options: dict[str, Any] = {
            "host": kwargs["host"],
            "port": kwargs["scheduler_port"],
            "dashboard_address": kwargs["dashboard_address"],
        }
        if security is not None:
            scheduler_options.update(security=security, protocol="tls://")
        return SpecCluster(
            scheduler={"cls": Scheduler, "options": scheduler_options},
            workers=gpu_worker_specs(devices, kwargs["threads_per_worker"], memory_limit, kwargs["host"], security),
            security=security,
            name=kwargs["name"],
        )
