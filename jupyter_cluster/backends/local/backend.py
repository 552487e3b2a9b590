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
  (:func:`jupyter_cluster.state.credentials.saved_security`).
"""

from __future__ import annotations

import errno
import ipaddress
import os
import sys
import uuid
import weakref
from typing import Any

from ... import config
from ..._core import tls_defaults
from ...engine.cluster import ENGINE_AT_SPAWN
from ...engine.worker import EnginePlugin
from ...errors import ClusterError
from ...state.credentials import forget_security, new_security, written_identity
from ...state.dashboard_socket import dashboard_on_unix_socket, link, parent_server_base_url, remove_dashboard_socket
from ...telemetry.hub import FLUSH_AT_SPAWN
from ...telemetry.producer import flush_plugin
from .. import Backend, StartedCluster
from ..cli import HOST, MEMORY_LIMIT, PORT, THREADS, TLS, WORKERS, Option
from . import dashboard
from .forkserver import environ_since_forkserver, start_forkserver, use_forkserver
from .gpus import GPU_RESOURCE, _cuda_cluster_class, gpu_worker_specs, select_gpus
from .main_guard import check_main_guard
from .workers import (
    ForkedNanny,
    IgnoreSigint,
    KernelMemoryNotOwn,
    NoWorkerHttp,
    QuietWorker,
    sigint_blocked_for_children,
)


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
    cli_options = (
        WORKERS,
        THREADS,
        MEMORY_LIMIT,
        PORT,
        HOST,
        TLS,
        Option("gpus", "one worker per visible GPU (or the devices given, like 0,1)", None, "DEVICES", kind="optional"),
    )
    api_options = ("name", "processes")

    def prepare(self, processes: bool | None = None, gpus: Any = None, **options: Any) -> None:
        """Start the fork server the workers will come from (see :func:`use_forkserver`)."""
        check_main_guard(processes)
        if processes is not False and gpus in (None, False) and use_forkserver():
            start_forkserver()

    def default_workers(self) -> int:
        """``local.workers`` in the configuration, else one per CPU this process may run on."""
        return int(config.get("local.workers") or default_workers())

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
        if sys.platform.startswith("linux"):
            tls_defaults.install()  # the scheduler here accepts TLS: tornado's default context, made at import
        devices = select_gpus(gpus) if gpus not in (None, False) else None
        if devices is not None and workers is not None and workers != len(devices):
            raise ClusterError(
                f"--gpus starts one worker per GPU ({len(devices)} here), so it cannot be combined with --workers {workers}; "
                "pick devices with --gpus 0,1 instead."
            )
        if devices is not None and processes is False:
            raise ClusterError("--gpus needs worker processes (each pinned to its GPU); leave out processes=False.")
        workers = workers if workers is not None else (len(devices) if devices is not None else self.default_workers())
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
            security = new_security(cred_name, reuse=True)  # a local cluster's key stays on this machine
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
            # In-process workers would count the whole kernel's memory against each one's limit.
            + ([KernelMemoryNotOwn()] if processes is False and not config.get("local.in-process-memory-pause") else [])
        )
        # The scheduler's Bokeh dashboard is attached once the cluster runs (see .dashboard): its import
        # was the largest step of a first start.
        dashboard_later = devices is None and dashboard.wanted(kwargs["dashboard_address"])
        if dashboard_later and dashboard.MODULE not in sys.modules:
            kwargs["scheduler_kwargs"] = {"dashboard": False}
        else:
            dashboard_later = False
        engine_at_spawn = devices is None and kwargs["processes"]
        if devices is None:
            # Each worker installs them before it registers with the scheduler (also after a
            # restart, and on scale-up): no window, and no round trip to every worker at start.
            # The engine's handlers and the telemetry's flush plugin too, in worker processes
            # (in-process workers would share one plugin object, which keeps its worker): a first map
            # skips registering them, two broadcasts through the scheduler that took 0.1-0.3 s of it.
            kwargs["plugins"] = tuple(plugins) + ((EnginePlugin(), flush_plugin()) if engine_at_spawn else ())
        if devices is None and kwargs["processes"] and use_forkserver():
            kwargs["env"] = environ_since_forkserver()  # {} before the server's first start
            kwargs["worker_class"] = ForkedNanny
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
        if engine_at_spawn:
            setattr(cluster, ENGINE_AT_SPAWN, True)
            setattr(cluster, FLUSH_AT_SPAWN, True)
        if dashboard_later:
            dashboard.attach_later(cluster)
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
        fields: dict[str, Any] = {}  # the cluster's own dashboard link unless its dashboard is off TCP
        if security is not None:
            cleanup.append(lambda: forget_security(cred_name, identity))
            # a cluster dropped without stop; the collector may get to it after a newer cluster took its name
            weakref.finalize(cluster, forget_security, cred_name, identity)
            if (
                getattr(cluster, "scheduler", None) is not None
                and getattr(cluster.scheduler, "http_server", None) is not None
            ):
                sock = dashboard_on_unix_socket(cluster)
                cleanup.append(lambda: remove_dashboard_socket(sock))
                weakref.finalize(cluster, remove_dashboard_socket, sock)
                extra["dashboard_socket"] = sock
                fields["dashboard_link"] = link(parent_server_base_url(), cred_name)
        return StartedCluster.of(
            cluster, security=security, worker_plugins=to_register, cleanup=cleanup, extra=extra, **fields
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
