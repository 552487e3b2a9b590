"""The process's clusters: start, attach, pick the current one, stop.

This module is the lifecycle core shared by the magics, ``Pool``, the map
engine, the widgets and the server extension.  It knows nothing of IPython or
HTTP.  A process can hold several clusters; one of them is *current* and is
used by ``%%parallel`` and ``Pool`` unless told otherwise.
"""

from __future__ import annotations

import atexit
import concurrent.futures.thread  # noqa: F401  (its exit hook must be registered before ours)
import contextlib
import html
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import config
from .._core import background as _background
from ..backends import StartedCluster, backend_classes, get_backend
from ..engine.cluster import workers_now
from ..engine.direct import release_leases
from ..errors import ClusterError
from ..state import registry
from ..state.credentials import names_with_credentials, saved_security
from ..telemetry.kernel import KernelSink
from ..telemetry.producer import set_kernel_sink
from ..wire.models import ClusterModel, cluster_model, validate_name, validate_size
from . import warm_up
from .client import connect_client, detach_when_lost
from .control import listen, stop_remote
from .display import render_html
from .final_word import leave_final_word
from .versions import warn_on_mismatch

logger = logging.getLogger(__name__)
_lock = threading.RLock()
#: the longest a stop waits for the start's engine warm-up to end (seconds)
WARM_UP_WAIT = 30.0
_handles: dict[str, ClusterHandle] = {}
_current: str | None = None
_owner_kind = "kernel"


def set_owner_kind(kind: str) -> None:
    """Say who owns clusters started by this process ("kernel", "panel", "process")."""
    global _owner_kind
    _owner_kind = kind


class ClusterHandle:
    """A cluster this process started or attached to.

    Attributes
    ----------
    name : str
        Unique name on this machine (the registry key).
    backend : str
        ``"local"``, ``"address"``, ``"kubernetes"`` or a plug-in backend.
    address : str
        Scheduler address.
    dashboard_link : str or None
        Dask dashboard URL.
    """

    def __init__(self, name: str, backend: str, started: StartedCluster, client: Any):
        self.name = name
        self.backend = backend
        self.address = started.address
        self.dashboard_link = started.dashboard_link
        self.security = started.security
        self.cluster = started.cluster
        self.client = client
        self.closed = False
        #: the registry record of the cluster when attached by name (None otherwise)
        self.attached_record: registry.ClusterRecord | None = None
        self._cleanup = list(started.cleanup)
        self.extra = dict(started.extra)
        #: the start's engine warm-up (local clusters), which a stop lets finish first
        self._warm_up: threading.Thread | None = None

    # -- state -----------------------------------------------------------
    @property
    def owns_cluster(self) -> bool:
        """Whether :meth:`close` shuts the cluster down (False when only attached)."""
        return self.cluster is not None

    @property
    def attachment(self) -> str:
        """How this process holds the cluster: started here, attached by name (whose) or by address."""
        if self.cluster is not None:
            return "started here"
        rec = self.attached_record
        if rec is None:
            return "attached by address"
        owner = {"panel": "the JupyterLab cluster panel", "kernel": "another kernel"}.get(
            rec.owner_kind, "another process"
        )
        return f"attached by name (started by {owner}, pid {rec.owner_pid})"

    def scheduler_gone(self) -> bool:
        """Whether the scheduler has stopped or no longer answers (the handle itself is still open)."""
        if self.closed:
            return False
        status = getattr(getattr(getattr(self.cluster, "scheduler", None), "status", None), "name", None)
        if status in ("closing", "closed", "failed"):  # a local cluster's scheduler, in this process
            return True
        return getattr(self.client, "status", "running") not in ("running", "newly-created")

    def _check_open(self) -> None:
        if self.closed:
            raise ClusterError(f"cluster {self.name!r} is stopped; start a new one with %cluster start.")

    def _workers(self) -> dict[str, Any]:
        self._check_open()
        return workers_now(self.client)

    def model(self) -> ClusterModel:
        """JSON-able description of the cluster and its workers (:func:`.models.cluster_model`)."""
        return cluster_model(
            self.name, self.backend, self.address, self.dashboard_link, self.owns_cluster, self._workers()
        )

    @property
    def nthreads(self) -> int:
        """Total worker threads (the cluster's parallelism right now)."""
        return sum(self.client.nthreads().values())

    # -- control -------------------------------------------------------------
    def scale(self, n: int) -> None:
        """Ask for ``n`` workers."""
        self._check_open()
        if n < 0:
            raise ClusterError("the number of workers must be 0 or more.")
        if self.cluster is None:
            raise ClusterError(
                f"cluster {self.name!r} was {self.attachment}, so it cannot be scaled from here; scale it where it was started."
            )
        self._check_limit(n)
        # workers retired under the start's warm-up made it report a false "maps go through the Dask
        # scheduler" notice
        self._wait_for_warm_up()
        self.cluster.scale(n)

    def _check_limit(self, n: int) -> None:
        """Refuse more workers than the backend can give (``Backend.max_workers``, where it has one)."""
        try:
            limit_of = getattr(get_backend(self.backend), "max_workers", None)
        except ClusterError:
            return
        limit = limit_of() if limit_of is not None else None
        if limit is not None and n > limit:
            raise ClusterError(
                f"{n} workers is more than the {self.backend} backend can run here (at most {limit}); ask for fewer."
            )

    def adapt(self, minimum: int = 0, maximum: int | None = None) -> None:
        """Let the number of workers follow the load, between ``minimum`` and ``maximum``."""
        self._check_open()
        if self.cluster is None:
            raise ClusterError(
                f"cluster {self.name!r} was {self.attachment}, so it cannot adapt from here; configure adaptivity where it was started."
            )
        if minimum < 0 or (maximum is not None and maximum < minimum):
            raise ClusterError("adapt needs 0 <= --minimum <= --maximum.")
        self._check_limit(maximum if maximum is not None else minimum)
        upper = maximum if maximum is not None else max(minimum, 1) * 4
        self.cluster.adapt(minimum=minimum, maximum=upper)
        # The panel draws an adaptive cluster's card apart, from the bounds in the registry record the
        # server reads (%cluster adapt, jc.adapt and the panel's Adapt alike all come here).
        self.extra["adaptive"] = {"minimum": minimum, "maximum": upper, "since": time.time()}
        record = registry.read(self.name)
        if record is not None and record.address == self.address and not record.attached:
            record.extra = dict(record.extra or {}, adaptive=self.extra["adaptive"])
            registry.write(record)

    def restart(self) -> None:
        """Restart every worker process (their memory and namespaces are cleared)."""
        self._check_open()
        self._wait_for_warm_up()
        self.client.restart()

    def _wait_for_warm_up(self) -> None:
        # A stop, restart or scale right after the start (a script, the next cell, the exit) would cut
        # the warm-up's broadcast to the workers: the scheduler logged an ERROR and the warm-up
        # printed a false "maps go through the Dask scheduler" notice.  It takes well under a
        # second, and waits at most 10 s for slow workers itself.
        warm_up = self._warm_up
        if warm_up is not None and warm_up is not threading.current_thread():
            warm_up.join(timeout=WARM_UP_WAIT)

    def wait_for_workers(self, n: int = 1, timeout: float | None = None) -> None:
        """Block until at least ``n`` workers are connected."""
        self._check_open()
        timeout = timeout if timeout is not None else config.timeout_seconds("connect-timeout")
        try:
            self.client.wait_for_workers(n, timeout=timeout)
        except (TimeoutError, OSError) as exc:
            raise ClusterError(f"cluster {self.name!r} has fewer than {n} workers after {timeout:g} s.") from exc

    def stop(self) -> None:
        """Stop the cluster (or detach from it, if it was only attached).

        The same as ``%cluster stop`` and :func:`jupyter_cluster.stop` for this
        cluster; :meth:`close` is another name for it.

        Raises
        ------
        ClusterError
            If the cluster was already stopped.
        """
        global _current
        gone = self.scheduler_gone()
        with _lock:
            if self.closed:
                raise ClusterError(f"cluster {self.name!r} is already stopped.")
            self.closed = True
            _handles.pop(self.name, None)
            if _current == self.name:
                _current = next(reversed(_handles), None) if _handles else None
        if self.cluster is not None:  # the owner: the maps' last messages out, then its final word
            leave_final_word(self, gone)
        if self.attached_record is None:
            registry.remove(self.name)
        else:  # attached by name: the record is its owner's; only our attachment goes
            registry.remove_attachment(self.name)
        if not gone:  # a warm-up talking to a scheduler that went away has nothing to finish
            self._wait_for_warm_up()
        if not gone:  # idle map leases end first, rather than being cut off by the cluster's close
            release_leases(self.client)
        try:
            self.client.close(timeout=1 if gone else 5)
        except Exception:  # the scheduler may already be gone; closing must still finish
            pass
        if self.cluster is not None:
            if gone and hasattr(self.cluster, "shutdown_scheduler"):
                # Nothing to shut down; asking a dead scheduler would wait out the whole timeout.
                self.cluster.shutdown_scheduler = False
            try:
                self.cluster.close(timeout=10)
            except Exception:
                pass
        for fn in self._cleanup:
            try:
                fn()
            except Exception:  # a credential file already gone, say
                pass

    def close(self) -> None:
        """Stop the cluster: another name for :meth:`stop`, as Dask's ``Client.close``."""
        self.stop()

    # -- display -------------------------------------------------------------
    def __repr__(self) -> str:
        state = "stopped" if self.closed else self.address
        return f"<ClusterHandle {self.name!r} backend={self.backend} {state}>"

    def _repr_html_(self) -> str:
        if self.closed:
            return f"<p>Cluster <b>{html.escape(self.name)}</b> is stopped.</p>"
        try:
            m = self.model()
        except Exception as exc:  # a vanished scheduler must not break display
            return f"<p>Cluster <b>{html.escape(self.name)}</b> at {html.escape(self.address)}: unreachable ({html.escape(str(exc))})</p>"
        return render_html(m)


# -- naming ------------------------------------------------------------------
def _taken_names() -> set[str]:
    return set(_handles) | {r.name for r in registry.live_records()}


def _unique_name(prefix: str) -> str:
    # A cluster another process is starting has no record yet, but its credentials or reservation exist.
    taken = _taken_names() | names_with_credentials() | registry.reserved_names()
    i = 0
    while True:
        i += 1
        if f"{prefix}-{i}" not in taken:
            with contextlib.suppress(ClusterError):  # another process took it since the look: the next one
                registry.reserve(f"{prefix}-{i}")
                return f"{prefix}-{i}"


def _register(handle: ClusterHandle, attached: bool) -> None:
    registry.write(
        registry.ClusterRecord(
            name=handle.name,
            backend=handle.backend,
            address=handle.address,
            dashboard_link=handle.dashboard_link,
            owner_kind=_owner_kind,
            attached=attached,
            extra=handle.extra,
        )
    )


def _adopt(handle: ClusterHandle, attached: bool) -> ClusterHandle:
    global _current
    with _lock:
        _handles[handle.name] = handle
        _current = handle.name
    _stop_at_kernel_shutdown()
    if handle.attached_record is None:  # attached by name: the cluster is in the registry already
        _register(handle, attached)
    if not attached:  # the owner answers scale/stop requests from the panel and other kernels
        listen(handle)
    if handle.backend != "local":  # other machines may run other package versions
        warn_on_mismatch(handle.client, handle.name)
    return handle


def _discard(started: StartedCluster) -> None:
    """Stop a cluster that never became a handle, and delete what it left on disk."""
    if started.cluster is not None:
        try:
            started.cluster.close()
        except Exception:  # it failed to start properly; closing must still finish
            pass
    for fn in started.cleanup:
        try:
            fn()
        except Exception:
            pass


# -- public API ----------------------------------------------------------------
def start(name: str | None = None, backend: str | None = None, wait: bool = True, **options: Any) -> ClusterHandle:
    """Start a cluster and make it the current one.

    Parameters
    ----------
    name : str, optional
        Unique name; defaults to ``<backend>-<n>``.
    backend : str, optional
        Backend name; defaults to ``jupyter-cluster.backend`` from dask.config.
    wait : bool
        Wait until the first worker has connected.  With ``wait=False`` a batch
        backend (slurm, pbs, sge, lsf) returns as soon as its jobs are submitted.
    **options
        Backend options, e.g. ``workers=8, threads=1, memory_limit="2GiB"``.
        ``dry_run=True`` (kubernetes) starts nothing and returns the YAML of
        the resources instead.

    Returns
    -------
    ClusterHandle

    Examples
    --------
    >>> import jupyter_cluster as jc
    >>> cluster = jc.start(workers=2)          # doctest: +SKIP
    >>> cluster.client.submit(sum, [1, 2]).result()  # doctest: +SKIP
    3
    """
    backend = backend or config.get("backend")
    impl = get_backend(backend)  # unknown backend: error before any name is taken
    if options.get("workers") == 0 and options.get("adapt_min") is None and options.get("adapt_max") is None:
        # only a cluster that adapts gets workers of its own accord; this one would wait forever
        raise ClusterError(
            "--workers 0 starts a cluster that can run nothing; ask for 1 or more (%cluster adapt --minimum 0 "
            "lets it shrink to none later), or give --adapt-max where the backend adapts from the start (kubernetes)."
        )
    if options.get("memory_limit") is not None:  # "1e999GB" raised OverflowError from the backend
        validate_size(options["memory_limit"], "--memory-limit", dask=True)
    impl.prepare(**options)  # e.g. the local fork server, while the extension's background import ends
    _background.wait()
    if name is not None:
        validate_name(name)
        if name in _taken_names():
            raise ClusterError(
                f"a cluster named {name!r} already exists; choose another --name or attach with %cluster connect {name}."
            )
        registry.reserve(name)  # atomic: of two starts of one name at one moment, one is refused here
    else:
        name = _unique_name(backend)
    try:
        return _start_reserved(name, backend, impl, wait, options)
    finally:
        registry.release(name)  # the record is written (or the start failed): the name needs no reservation


def _start_reserved(name: str, backend: str, impl: Any, wait: bool, options: dict[str, Any]) -> ClusterHandle:
    options = {k: v for k, v in options.items() if v is not None}
    if "name" in impl.options:
        options["name"] = name
    if options.pop("dry_run", False):  # returns the resources as text and starts nothing
        if not hasattr(impl, "dry_run"):
            raise ClusterError(f"the {backend} backend has no --dry-run; it creates no resources to show.")
        return impl.dry_run(**options)
    if getattr(impl, "takes_wait", False):  # a batch backend: --no-wait returns with its jobs queued
        options["wait"] = wait
    started = impl.start(**options)
    try:
        client = connect_client(started, name)
    except BaseException:
        _discard(started)
        raise
    handle = ClusterHandle(name, backend, started, client)
    try:
        for plugin in started.worker_plugins:
            client.register_plugin(plugin)
    except BaseException:  # the stop button too: a cluster that is listed nowhere would run until the kernel exits
        handle.closed = True
        client.close()
        _discard(started)
        raise
    if wait and started.cluster is not None and options.get("workers", 1) != 0:
        try:
            handle.wait_for_workers(1, timeout=max(config.timeout_seconds("connect-timeout"), 60))
        except BaseException:
            handle.closed = True
            client.close()
            _discard(started)
            raise
        if backend == "local":
            # The engine's first direct-path check (about 150 ms) runs while the user writes the next
            # cell, not in the first map.  Local workers are always reachable; elsewhere the check may
            # print a fallback notice, which belongs to the map that needs it, not to some later cell.
            # Every worker asked for (the start waited for one): each gets its warm-up and connections.
            # None when a call waits for this cluster now (a script's Pool()): see warm_up.py.
            handle._warm_up = warm_up.begin(client, len(getattr(started.cluster, "worker_spec", None) or {}) or None)
    return _adopt(handle, attached=False)


def connect(target: str, security: Any = None) -> ClusterHandle:
    """Attach to a running scheduler by address or by registry name; it becomes current.

    Parameters
    ----------
    target : str
        ``tcp://host:port`` (or ``tls://``), the name of a cluster listed
        by :func:`clusters`, or the name of a cluster of the configured
        dask-gateway (``gateway.address``).
    security : distributed.Security, optional
        Credentials for a TLS scheduler.
    """
    if target in _handles:
        global _current
        _current = target
        return _handles[target]
    record = None
    via_backend: StartedCluster | None = None
    if "://" in target or (":" in target and target.rsplit(":", 1)[-1].isdigit()):
        address, name = target, None
        if security is None and address.startswith("tls://"):  # one of this user's TLS clusters?
            security = _security_for_address(address)
    else:
        record = registry.read(target)
        via_backend = _attach_by_name(target, record)  # a dask-gateway cluster: reached through its gateway
        if record is None and via_backend is None:
            known = ", ".join(r.name for r in registry.live_records()) or "none"
            raise ClusterError(f"no cluster named {target!r} is running (known: {known}); see %cluster list.")
        if via_backend is not None:
            address, name, security = via_backend.address, record.name if record else target, via_backend.security
        elif record is not None:
            address, name = record.address, f"{record.name}"
            if security is None and address.startswith("tls://"):  # a TLS cluster started on this machine
                security = saved_security(record.name)
    started = via_backend or get_backend("address").start(address=address, security=security)
    if record is not None:  # the cluster's own name and dashboard, as the registry has them
        started.dashboard_link = started.dashboard_link or record.dashboard_link
    reserved, name = name is None, name or _unique_name("remote")  # a picked name is reserved till its record
    try:
        client = connect_client(started, name)
        detach_when_lost(client, name, address, target if record is not None else address)
        handle = ClusterHandle(name, "address", started, client)
        handle.attached_record = record
        if record is not None:  # the panel follows this kernel's notebook to the cluster from now on
            registry.write_attachment(record.name, record.address)
        return _adopt(handle, attached=True)
    finally:
        if reserved:  # its record is written now (or the connection failed)
            registry.release(name)


def _attach_by_name(target: str, record: registry.ClusterRecord | None) -> StartedCluster | None:
    """How a backend reaches the cluster called ``target`` (``Backend.attach``), or None for its record's address.

    With a record, its backend is asked; a name this machine has no record of is
    offered to every backend (a dask-gateway's own cluster names).
    """
    if record is not None:
        try:
            impl = get_backend(record.backend)
        except ClusterError:  # a backend not installed here: its scheduler's address is all there is
            return None
        return impl.attach(target, record)
    for cls in backend_classes().values():
        found = cls().attach(target, None)
        if found is not None:
            return found
    return None


def _security_for_address(address: str) -> Any:
    """The saved credentials of the registered cluster listening at ``address``, or None."""
    for record in registry.live_records():
        if record.address == address and not record.attached:
            security = saved_security(record.name)
            if security is not None:
                return security
    return None


def current(start_default: bool = False, announce: Callable[[str], None] | None = None) -> ClusterHandle | None:
    """The current cluster.

    Parameters
    ----------
    start_default : bool
        With no cluster, start the default one (and say so through ``announce``).
    announce : callable, optional
        Called with a one-line message when a default cluster is started.
    """
    with _lock:
        handle = _handles.get(_current) if _current else None
    if handle is not None and start_default and handle.scheduler_gone():
        raise ClusterError(
            f"the scheduler of cluster {handle.name!r} at {handle.address} has stopped or does not answer; "
            "%cluster stop forgets it, then %cluster start makes a new one."
        )
    if handle is None and start_default:
        with warm_up.for_a_waiting_call():  # the call that asked is the first use: no warm-up beside it
            handle = start()
        if announce is not None:
            announce(
                f"Started cluster {handle.name!r} ({handle.backend}, {handle.nthreads} worker threads) at {handle.address}; stop it with %cluster stop."
            )
    return handle


def resolve(cluster: Any = None) -> Any:
    """The cluster a call works on; the one rule for map, Pool, Queue, actors and the magics.

    Parameters
    ----------
    cluster : ClusterHandle, distributed.Client, str or None
        Given, it is used as is (a string names a cluster this process holds).
        None: inside a task, the worker's client; in the notebook, the current
        cluster, started with the defaults if there is none (one printed line
        says so).

    Returns
    -------
    ClusterHandle or distributed.Client
    """
    if isinstance(cluster, str):
        return get(cluster)
    if cluster is not None:
        return cluster
    if _in_task():
        from distributed import get_client

        return get_client()
    return current(start_default=True, announce=print)


def client_of(cluster: Any = None) -> Any:
    """The ``distributed.Client`` of :func:`resolve`'s cluster."""
    found = resolve(cluster)
    return getattr(found, "client", found)


def _in_task() -> bool:
    if "distributed" not in sys.modules:  # a task always has it imported; the notebook may not yet
        return False
    from distributed import get_worker

    try:
        get_worker()
    except ValueError:
        return False
    return True


def get(name: str | None = None) -> ClusterHandle:
    """The cluster called ``name`` held by this process (the current one by default)."""
    if name is None:
        handle = current()
        if handle is None:
            raise ClusterError("no cluster is running in this kernel; start one with %cluster start.")
        return handle
    handle = _handles.get(name)
    if handle is None:
        mine = ", ".join(_handles) or "none"
        raise ClusterError(f"no cluster named {name!r} is held by this kernel (held: {mine}).")
    return handle


def handles() -> list[ClusterHandle]:
    """The clusters held by this process."""
    return list(_handles.values())


def clusters() -> list[dict[str, Any]]:
    """Every live cluster on this machine, from the registry (dicts, oldest first)."""
    out = []
    for rec in registry.live_records():
        held = _handles.get(rec.name)
        if held is not None and rec.owner_pid == _pid() and held.scheduler_gone():
            continue  # ours, but its scheduler died: nothing anyone can use
        d = rec.to_dict()
        d["here"] = rec.name in _handles and rec.owner_pid == _pid()
        d["current"] = d["here"] and rec.name == _current
        out.append(d)
    return out


def _pid() -> int:
    return os.getpid()


def stop(name: str | None = None) -> str:
    """Stop (or detach from) a cluster held by this process; returns its name.

    A cluster started from the JupyterLab panel (held by no kernel) is stopped
    by asking its owner process, see :func:`jupyter_cluster.cluster.control.stop_remote`.
    """
    if name is not None and name not in _handles and registry.read(name) is not None:
        return stop_remote(name)
    if name is None and not _handles:
        raise ClusterError("no cluster is running in this kernel, so there is nothing to stop.")
    handle = get(name)
    handle.close()
    return handle.name


def stop_all() -> None:
    """Stop every cluster this process holds (run at exit)."""
    for handle in list(_handles.values()):
        try:
            handle.close()
        except ClusterError:
            pass


def _stop_at_kernel_shutdown() -> None:
    """In a Jupyter kernel, stop this process's clusters as soon as the kernel is asked to shut down.

    Asked to shut down (or restart), ipykernel first signals every process in its
    group -- the workers, the fork server, multiprocessing's resource tracker --
    SIGTERM, and keeps at it for 14 s while one ignores it (the resource tracker
    does); Jupyter's kernel manager meanwhile kills the kernel itself with
    SIGTERM after half its ``shutdown_wait_time`` (2.5 s of 5), before Python's
    exit hooks run.  The clusters were then never stopped: their registry
    records and TLS credentials stayed on disk, and the workers died of the
    signal.  Stopping them in ``do_shutdown``, which ipykernel runs before it
    signals anything, lets them close as ``%cluster stop`` closes them.
    """
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    kernel = getattr(shell, "kernel", None)
    if kernel is None or getattr(kernel, "_jc_stops_clusters", False) or not hasattr(kernel, "do_shutdown"):
        return
    shutdown = kernel.do_shutdown

    def do_shutdown(restart: bool) -> Any:
        stop_all()
        return shutdown(restart)

    kernel.do_shutdown = do_shutdown
    kernel._jc_stops_clusters = True


def _stop_all_before_executors() -> None:
    # At exit concurrent.futures refuses new work once its own hook in threading's shutdown has
    # run, and the Dask future callbacks fired by closing a cluster after it print a traceback
    # each ("cannot schedule new futures after interpreter shutdown").  Hooks run last-registered
    # first, so this one runs before it -- unless a thread of the program still runs and may
    # use a cluster: then the atexit hook stops them after it ends.  A child forked by
    # multiprocessing runs these hooks too, and must not touch the parent's clusters.
    if os.getpid() != _PID:
        return
    if not any(t.is_alive() and not t.daemon and t is not threading.main_thread() for t in threading.enumerate()):
        stop_all()


_PID = os.getpid()
atexit.register(stop_all)
threading._register_atexit(_stop_all_before_executors)  # type: ignore[attr-defined]


# The notebook's own metric reports go to this kernel's store and through its current cluster:
# telemetry.report is the producer alone (it runs on every worker) and knows nothing of sessions.
set_kernel_sink(KernelSink(current))
