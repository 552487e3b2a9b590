"""What every local worker process gets: SIGINT blocked then ignored, no TCP HTTP server, a quiet close.

And the nanny of a forked worker (:class:`ForkedNanny`), which leaves the notebook's environment alone.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any

from distributed import Nanny, WorkerPlugin

from .sigint import sigint_blocked_for_children  # noqa: F401  (re-exported: where it was)


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

    Like the scheduler's dashboard (:func:`.dashboard_socket.dashboard_on_unix_socket`), a
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


#: How often a forked worker's nanny looks whether the worker has registered, in seconds.
INIT_POLL_SECONDS = 0.005


class ForkedNanny(Nanny):
    """The nanny of a worker forked from the fork server: the notebook's own environment stays as it was.

    Dask's nanny puts ``distributed.nanny.pre-spawn-environ`` (``OMP_NUM_THREADS=1``
    and the like) into the environment of the process it runs in, the notebook's,
    before each worker start, for the worker's new interpreter to start with;
    numpy imported in the notebook afterwards then runs on one thread.  A forked
    worker's interpreter is the fork server's, which started with them
    (:func:`.forkserver.start_forkserver`), and each worker still sets them
    itself before it runs anything (the nanny's ``env``, which includes them).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pre_spawn_env = {}

    # Dask's nanny learns that its worker has registered by polling a queue every 50 ms
    # (``WorkerProcess._init_msg_interval``): 25 ms on average of a script's first result.  A
    # forked worker is up in tens of ms, so this nanny's process polls every 5 ms (a
    # ``get_nowait()``: microseconds each).
    @property
    def process(self) -> Any:
        return self.__dict__.get("_process")

    @process.setter
    def process(self, value: Any) -> None:
        if value is not None:
            value._init_msg_interval = INIT_POLL_SECONDS
        self.__dict__["_process"] = value


class KernelMemoryNotOwn(WorkerPlugin):
    """Worker plugin for ``processes=False`` workers: no pausing or spilling by the process's memory.

    Workers in the kernel's own process measure the whole kernel's memory
    (Dask's memory monitor reads the process's RSS), so each held everything
    the kernel used against its own limit: three workers with 1 GiB each
    paused once the kernel passed 0.8 GiB, and a map waited on them for ever
    (issue 37).  The limit still bounds the data each worker keeps (Dask's
    ``target`` fraction counts a worker's own data).  The setting
    ``jupyter-cluster.local.in-process-memory-pause: true`` keeps Dask's behaviour.
    """

    idempotent = True
    name = "jupyter-cluster-kernel-memory-not-own"

    def setup(self, worker) -> None:
        manager = getattr(worker, "memory_manager", None)
        if manager is not None:
            manager.memory_pause_fraction = False
            manager.memory_spill_fraction = False
