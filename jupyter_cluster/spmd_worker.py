"""The worker half of ``%%spmd``: one rank of a torch.distributed group per worker process.

Everything here runs inside Dask worker processes and imports nothing of the
notebook side; torch is imported only when a rank needs it.

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
import gc
import io
import os
import socket
import sys
import threading
import time
import traceback
from typing import Any

from .telemetry.topics import SPMD_OUTPUT_TOPIC as OUTPUT_TOPIC

#: error messages that mean "a peer went away", not "this rank's code failed"
COLLATERAL_MARKERS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "ECONNRESET",
    "EPIPE",
    "Connection refused",
    "NCCL communicator was aborted",
)


#: seconds between a rank's first unsent write and its flush
OUTPUT_FLUSH_S = 0.2


class _RankState:
    def __init__(self) -> None:
        self.group: str | None = None
        self.generation: int | None = None
        self.rank: int | None = None
        self.world_size: int | None = None
        self.backend: str | None = None
        self.timeout: float | None = None
        self.namespace: dict[str, Any] = {"__name__": "__main__"}
        self.stores: dict[tuple[str, int], Any] = {}  # (group, generation) -> master TCPStore (rank 0)
        self.thread: int | None = None  # thread id running a cell of this group
        self.running: str | None = None  # group id of the running cell
        self.interrupted = False
        self.lock = threading.Lock()
        self.local = threading.local()
        self.streams_installed = False


_STATE = _RankState()


# -- output capture ----------------------------------------------------------------------
class _Capture:
    """A rank's printed output: kept whole for the result, and streamed to the notebook as it grows.

    The first write after a flush arms a flush on the worker's event loop
    ``OUTPUT_FLUSH_S`` later, which sends the new text (with its offset in the
    output) on :data:`OUTPUT_TOPIC`; the notebook prints whole lines as they
    arrive and the rest from the result, so nothing is printed twice.
    """

    def __init__(self, worker=None, job: str | None = None, rank: int | None = None):
        self.buf = io.StringIO()
        self.worker, self.job, self.rank = worker, job, rank
        self.sent = 0
        self.armed = False
        self.closed = False

    def write(self, s: str) -> int:
        n = self.buf.write(s)
        if self.worker is not None and not self.armed and not self.closed:
            self.armed = True
            try:
                self.worker.loop.add_callback(self._arm)
            except Exception:  # a closing worker: the result still carries the output
                self.worker = None
        return n

    def _arm(self) -> None:
        self.worker.loop.call_later(OUTPUT_FLUSH_S, self._flush)

    def _flush(self) -> None:  # on the worker's event loop
        self.armed = False
        if self.closed:
            return
        text = self.buf.getvalue()
        if len(text) <= self.sent:
            return
        offset, self.sent = self.sent, len(text)
        try:
            self.worker.log_event(
                OUTPUT_TOPIC, {"job": self.job, "rank": self.rank, "offset": offset, "text": text[offset:]}
            )
        except Exception:  # the result still carries the output
            pass

    def getvalue(self) -> str:
        return self.buf.getvalue()


# -- run with client.run ----------------------------------------------------------------
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


def open_store(group: str, generation: int, world_size: int, timeout: float) -> int:
    """Rank 0's worker: start the rendezvous store on a free port, return the port.

    Runs on the worker's event loop through ``Client.run``; creating a master
    ``TCPStore`` does not wait for the other ranks (``wait_for_workers=False``).
    """
    import torch.distributed as dist

    store = dist.TCPStore(
        "0.0.0.0",
        0,
        world_size,
        is_master=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=timeout),
    )
    with _STATE.lock:
        # older generations' stores are not needed once a newer one exists
        for key in [k for k in _STATE.stores if k[0] != group or k[1] < generation]:
            _STATE.stores.pop(key, None)
        _STATE.stores[(group, generation)] = store
    return int(store.port)


def interrupt(group: str) -> bool:
    """Raise ``KeyboardInterrupt`` in the thread running this group's cell (if any).

    Done under the state lock, which :func:`run_rank` also holds when it
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
        _STATE.stores.clear()
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


# -- the task -------------------------------------------------------------------------
def _destroy_process_group() -> None:
    if "torch.distributed" not in sys.modules:
        return
    import torch.distributed as dist

    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # a broken group still has to go
        pass


def _set_env(spec: dict[str, Any]) -> None:
    os.environ.update(
        {
            "RANK": str(spec["rank"]),
            "WORLD_SIZE": str(spec["world_size"]),
            "LOCAL_RANK": str(spec["local_rank"]),
            "LOCAL_WORLD_SIZE": str(spec["local_world_size"]),
            "MASTER_ADDR": spec["host"],
            "MASTER_PORT": str(spec["port"]),
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
    if spec["rank"] == 0:
        with st.lock:
            store = st.stores.get((spec["group"], spec["generation"]))
        if store is None:
            raise RuntimeError(
                "the rendezvous store of this %%spmd group is gone from rank 0's worker (was it restarted?)"
            )
    else:
        store = dist.TCPStore(spec["host"], spec["port"], spec["world_size"], is_master=False, timeout=timeout)
    dist.init_process_group(
        spec["backend"], store=store, rank=spec["rank"], world_size=spec["world_size"], timeout=timeout
    )
    st.generation = spec["generation"]
    st.timeout = spec["timeout"]


def _load_cell(payload: dict[str, Any]):
    """Compile the cell; its modules imported and small values unpickled (``CellFunction.load_values``)."""
    func = payload["func"]
    values = func.load_values()
    values.update(payload.get("large") or {})
    return func.compile(), values


def _execute(payload: dict[str, Any], spec: dict[str, Any]) -> Any:
    ns = _STATE.namespace
    if payload["kind"] == "cell":
        from .cellfunc import RESULT_NAME

        code, values = _load_cell(payload)
        ns.update(values)
        ns["rank"], ns["world_size"] = spec["rank"], spec["world_size"]
        ns.pop(RESULT_NAME, None)
        try:
            exec(code, ns)
            return ns.get(RESULT_NAME)
        finally:
            ns.pop(RESULT_NAME, None)
    fn, args, kwargs = payload["fn"], payload["args"], dict(payload["kwargs"])
    for name, value in (("rank", spec["rank"]), ("world_size", spec["world_size"]), ("state", ns)):
        if name in payload.get("inject", ()):
            kwargs[name] = value
    return fn(*args, **kwargs)


def _user_traceback(exc: BaseException) -> BaseException:
    """Start the traceback at the cell (or the user's function): drop this module's frames."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return exc.with_traceback(tb) if tb is not None else exc


def _forget_frames(exc: BaseException) -> None:
    """Drop what an exception (and those chained to it) keeps alive: its frames' locals and its traceback."""
    seen = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        if link.__traceback__ is not None:
            traceback.clear_frames(link.__traceback__)
            link.__traceback__ = None
        link = link.__cause__ or link.__context__


def _collateral(exc: BaseException) -> bool:
    text = str(exc)
    return any(m in text for m in COLLATERAL_MARKERS)


def _sendable(value: Any) -> tuple[Any, str | None]:
    """``value`` if it can travel back to the notebook, else (None, why)."""
    if value is None or type(value) in (bool, int, float, str, bytes):
        return value, None
    import cloudpickle

    try:
        cloudpickle.dumps(value)
        return value, None
    except Exception as exc:
        return None, f"{type(value).__qualname__} cannot be pickled ({exc})"


def run_rank(spec: dict[str, Any], payload: dict[str, Any]) -> dict[str, Any]:
    """Run one ``%%spmd`` cell (or function) as rank ``spec["rank"]``; failures are returned as data.

    On failure the process group is destroyed at once, which releases every
    peer blocked in a collective with this rank.
    """
    try:
        return _run_rank(spec, payload)
    except KeyboardInterrupt:  # an interrupt that landed as the cell was ending
        now = time.time()
        return {
            "rank": spec["rank"],
            "pid": os.getpid(),
            "ok": False,
            "started": now,
            "ended": now,
            "failed_at": now,
            "error": (None, "KeyboardInterrupt", "", "KeyboardInterrupt\n", None),
            "collateral": True,
            "interrupted": True,
            "output": "",
        }


def _run_rank(spec: dict[str, Any], payload: dict[str, Any]) -> dict[str, Any]:
    from .engine.worker import error_info

    st = _STATE
    from .engine.worker import install_thread_streams

    install_thread_streams(_STATE)
    worker = None
    if spec.get("stream"):
        try:
            from distributed import get_worker

            worker = get_worker()
        except Exception:  # not in a Dask task: the output comes with the result
            worker = None
    cap = _Capture(worker, spec.get("job"), spec["rank"])
    started = time.time()
    with st.lock:
        st.thread, st.running, st.interrupted = threading.get_ident(), spec["group"], False
    st.local.buf = cap
    result: dict[str, Any] = {"rank": spec["rank"], "pid": os.getpid(), "started": started}
    try:
        try:
            _ensure_group(spec)
            value = _execute(payload, spec)
            value, why = _sendable(value)
            result.update(ok=True, value=value, unsendable=why)
        except BaseException as exc:  # noqa: BLE001 - every rank failure is data, so peers can be released
            result.update(
                ok=False,
                failed_at=time.time(),
                error=error_info(_user_traceback(exc)),
                collateral=_collateral(exc) or (isinstance(exc, KeyboardInterrupt) and st.interrupted),
                interrupted=isinstance(exc, KeyboardInterrupt),
            )
            _forget_frames(exc)
        if not result["ok"]:
            # Peers blocked on this rank get "Connection closed by peer" once its sockets close, which
            # happens only when the process group object is freed: a failed collective's frames (kept
            # alive by the exception's traceback) hold it, so they were cleared above.  Measured with
            # 4 ranks in Dask: without this, a rank waiting on a collateral failure stayed blocked.
            gc.collect()
            _destroy_process_group()
            st.generation = None
    finally:
        st.local.buf = None
        with st.lock:
            st.thread = st.running = None
        cap.closed = True
        result["output"] = cap.getvalue()
        result["ended"] = time.time()
    return result
