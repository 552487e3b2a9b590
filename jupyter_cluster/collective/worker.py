"""The worker half of ``%%spmd``: one rank of a torch.distributed group per worker process.

Everything here runs inside Dask worker processes and imports nothing of the
notebook side; torch is imported only when a rank needs it.  This module holds the
rank's state, the calls the client makes with ``Client.run`` (:func:`probe`,
:func:`open_store`, :func:`interrupt`, :func:`teardown`, :func:`status`) and the
rank's set-up (:func:`_ensure_group`); the task that runs a cell is
:mod:`~jupyter_cluster.collective.task`, the rendezvous keys
:mod:`~jupyter_cluster.collective.rendezvous`.

A worker process holds at most one rank (torch.distributed has one default
process group per process).  Its state, :data:`_STATE`, lives as long as the
process:

* ``group`` — the id of the SPMD group this process is a rank of; a new id
  (membership changed) means a fresh per-rank namespace;
* ``generation`` — which rendezvous of that group the process group belongs
  to; the client starts a new generation after a cell failed or was
  interrupted, which re-initialises the process group but keeps the namespace
  (the model built in an earlier cell survives an exception in a later one);
* ``namespace`` — the names ``%%spmd`` cells assign, kept across cells.

Failures must never leave a peer blocked in a collective.  Measured with gloo
(torch 2.14): destroying the process group in the process whose cell raised
closes its connections, and a peer blocked in ``all_reduce`` on it gets
"Connection closed by peer" within milliseconds; a SIGKILLed process does the
same through the OS.  Destroying or aborting the group from *another thread*
of a blocked process does **not** release its own blocked call, so an
interrupt raises ``KeyboardInterrupt`` in each rank's thread instead (which
takes effect as soon as the rank runs Python again), and the group's timeout
is the last resort for a rank stuck in C++.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
import sys
import threading
from typing import Any

from . import rendezvous


class _RankState:
    def __init__(self) -> None:
        self.group: str | None = None
        self.generation: int | None = None
        self.rank: int | None = None
        self.world_size: int | None = None
        self.backend: str | None = None
        self.timeout: float | None = None
        self.namespace: dict[str, Any] = {"__name__": "__main__"}
        # The process group's store.  torch keeps only its C++ half: once the Python object is freed, every later
        # call (dist.new_group in a cell, say) fails with "Not implemented", so it is held here while the group lives.
        self.store: Any = None
        self.thread: int | None = None  # thread id running a cell of this group
        self.running: str | None = None  # group id of the running cell
        self.interrupted = False
        self.lock = threading.Lock()
        self.local = threading.local()
        self.streams_installed = False


_STATE = _RankState()


# -- the calls the client makes with Client.run ------------------------------------------
def probe() -> dict[str, Any]:
    """What this worker offers a rank: torch (version or import error), GPUs, host, pid."""
    info: dict[str, Any] = {
        "pid": os.getpid(),
        "hostname": socket.gethostname(),
        "torch": None,
        "error": None,
        "gpus": 0,
    }
    try:
        import torch
        import torch.distributed as dist

        info["torch"] = torch.__version__
        if not dist.is_available():
            info["error"] = "this torch build has no torch.distributed"
        info["gloo"] = bool(dist.is_available() and dist.is_gloo_available())
        info["nccl"] = bool(dist.is_available() and dist.is_nccl_available())
        info["gpus"] = int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    except Exception as exc:  # ImportError, or a broken CUDA setup
        info["error"] = f"{type(exc).__name__}: {exc}"
    return info


def open_store(group: str, generation: int, dask_worker=None) -> str:
    """Rank 0's worker: hold a new rendezvous generation's keys; return this worker's address.

    The ranks reach the keys through :data:`~jupyter_cluster.collective.rendezvous.STORE_HANDLER` on this worker's own
    Dask comm, which on a TLS cluster answers only peers holding the cluster's
    certificate: see :class:`~jupyter_cluster.collective.rendezvous._StoreKeys` for why no ``TCPStore`` is opened.
    """
    worker = dask_worker if dask_worker is not None else _this_worker()
    rendezvous.open_generation(worker, group, generation)
    return str(worker.address)


def _this_worker():
    from distributed import Worker, get_worker

    try:
        return get_worker()
    except ValueError:  # not in a task (Client.run in a thread): the process's one worker
        return next(iter(Worker._instances))


def interrupt(group: str) -> bool:
    """Raise ``KeyboardInterrupt`` in the thread running this group's cell (if any).

    Done under the state lock, which :func:`~jupyter_cluster.collective.task.run_rank` also holds when it
    forgets its thread, so the exception can only land inside the rank's
    own code (where it is caught), never in Dask's thread after the cell.
    """
    import ctypes

    with _STATE.lock:
        ident = _STATE.thread if _STATE.running == group else None
        if ident is None:
            return False
        _STATE.interrupted = True
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(KeyboardInterrupt))
    return True


def teardown(group: str | None = None) -> bool:
    """Destroy this process's rank of ``group`` (any group when None) and forget its state."""
    with _STATE.lock:
        if group is not None and _STATE.group != group:
            return False
        busy = _STATE.running is not None
    if not busy:
        _destroy_process_group()
    with _STATE.lock:
        _STATE.group = _STATE.generation = _STATE.rank = _STATE.world_size = None
        _STATE.namespace = {"__name__": "__main__"}
    gone = rendezvous.forget_all()
    if gone:  # calls still waiting on these keys answer "gone" now, not at their timeout
        loop = _this_worker().loop
        for keys in gone:
            loop.add_callback(keys.close)
    return True


def status() -> dict[str, Any]:
    """This worker's rank, for ``%spmd`` and tests."""
    initialized = False
    if "torch.distributed" in sys.modules:
        try:
            initialized = bool(sys.modules["torch.distributed"].is_initialized())
        except Exception:
            pass
    return {
        "group": _STATE.group,
        "generation": _STATE.generation,
        "rank": _STATE.rank,
        "world_size": _STATE.world_size,
        "running": _STATE.running is not None,
        "initialized": initialized,
        "names": sorted(k for k in _STATE.namespace if not k.startswith("__")),
    }


# -- the rank's set-up ----------------------------------------------------------------------
def _destroy_process_group() -> None:
    if "torch.distributed" not in sys.modules:
        return
    import torch.distributed as dist

    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # a broken group still has to go
        pass
    _STATE.store = None


def _set_env(spec: dict[str, Any]) -> None:
    os.environ.update(
        {
            "RANK": str(spec["rank"]),
            "WORLD_SIZE": str(spec["world_size"]),
            "LOCAL_RANK": str(spec["local_rank"]),
            "LOCAL_WORLD_SIZE": str(spec["local_world_size"]),
            "MASTER_ADDR": spec["host"],
        }
    )


def _ensure_group(spec: dict[str, Any]) -> None:
    """Join (or keep) this worker's rank of the group ``spec`` describes."""
    import torch.distributed as dist

    st = _STATE
    timeout = datetime.timedelta(seconds=spec["timeout"])
    if st.group != spec["group"]:
        _destroy_process_group()
        st.group, st.generation = spec["group"], None
        st.namespace = {"__name__": "__main__"}
    st.rank, st.world_size, st.backend = spec["rank"], spec["world_size"], spec["backend"]
    _set_env(spec)
    if spec["backend"] == "nccl":
        import torch

        torch.cuda.set_device(spec["local_rank"] % max(1, torch.cuda.device_count()))
    if st.generation == spec["generation"] and dist.is_initialized():
        if st.timeout != spec["timeout"]:
            from torch.distributed import distributed_c10d

            distributed_c10d._set_pg_timeout(timeout)
            st.timeout = spec["timeout"]
        return
    _destroy_process_group()
    worker = _this_worker()
    if spec["rank"] == 0 and not rendezvous.holds(spec["group"], spec["generation"]):
        raise RuntimeError("the rendezvous store of this %%spmd group is gone from rank 0's worker (was it restarted?)")
    _bind_to_worker_interface(spec["bind"])
    store = st.store = rendezvous.cluster_store(
        worker, spec["store"], spec["group"], spec["generation"], spec["timeout"]
    )
    dist.init_process_group(
        spec["backend"], store=store, rank=spec["rank"], world_size=spec["world_size"], timeout=timeout
    )
    st.generation = spec["generation"]
    st.timeout = spec["timeout"]


def _interface_of(host: str) -> str | None:
    """The name of the network interface that has address ``host`` (e.g. ``lo`` for 127.0.0.1), if any."""
    import psutil

    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        try:
            ip = ipaddress.ip_address(socket.gethostbyname(host))
        except (OSError, ValueError):
            return None
    for name, addrs in psutil.net_if_addrs().items():
        for addr in addrs:
            try:
                if ipaddress.ip_address(addr.address.split("%", 1)[0]) == ip:
                    return name
            except ValueError:  # a MAC address
                continue
    return None


#: prefix of the variables that say which GLOO_/NCCL_SOCKET_IFNAME value this module set
IFNAME_MARK = "JUPYTER_CLUSTER_SET_"


def _bind_to_worker_interface(host: str) -> None:
    """Make gloo and nccl listen on the worker's own interface (loopback on a local cluster).

    Left alone, gloo listens on the address the machine's host name resolves to,
    which may face the network even when the cluster itself is loopback only.
    A value the user set is kept.
    """
    ifname = _interface_of(host)
    if ifname is None:
        return
    for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        # The mark travels with the value: a process that inherits both (a batch job submitted by a kernel
        # whose in-process ranks bound to loopback) knows the value is ours, not the user's, and rebinds.
        mark = IFNAME_MARK + var
        if var not in os.environ or os.environ[var] == os.environ.get(mark):
            os.environ[var] = os.environ[mark] = ifname
