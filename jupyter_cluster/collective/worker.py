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

import asyncio
import datetime
import gc
import io
import ipaddress
import os
import socket
import sys
import threading
import time
import traceback
import typing
from typing import Any

from ..cell.function import RESULT_NAME
from ..telemetry.topic_names import SPMD_OUTPUT_TOPIC as OUTPUT_TOPIC

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
#: the worker handler (Dask comm op) that serves a group's rendezvous keys from rank 0's worker
STORE_HANDLER = "jc_spmd_store"
#: what a store call may wait for its answer beyond the store's own timeout (the comm round trip)
STORE_SLACK_S = 30.0


class _RankState:
    def __init__(self) -> None:
        self.group: str | None = None
        self.generation: int | None = None
        self.rank: int | None = None
        self.world_size: int | None = None
        self.backend: str | None = None
        self.timeout: float | None = None
        self.namespace: dict[str, Any] = {"__name__": "__main__"}
        self.stores: dict[tuple[str, int], _StoreKeys] = {}  # (group, generation) -> its keys (rank 0)
        self.ifnames: dict[str, str] = {}  # GLOO_/NCCL_SOCKET_IFNAME values this module set (not the user's)
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


def open_store(group: str, generation: int, dask_worker=None) -> str:
    """Rank 0's worker: hold a new rendezvous generation's keys; return this worker's address.

    The ranks reach the keys through :data:`STORE_HANDLER` on this worker's own
    Dask comm, which on a TLS cluster answers only peers holding the cluster's
    certificate: see :class:`_StoreKeys` for why no ``TCPStore`` is opened.
    """
    worker = dask_worker if dask_worker is not None else _this_worker()
    worker.handlers[STORE_HANDLER] = _serve_store
    with _STATE.lock:
        # older generations' keys are not needed once a newer one exists; their waiting calls end now
        for key in [k for k in _STATE.stores if k[0] != group or k[1] < generation]:
            worker.loop.add_callback(_STATE.stores.pop(key).close)
        _STATE.stores[(group, generation)] = _StoreKeys()
    return str(worker.address)


def _this_worker():
    from distributed import Worker, get_worker

    try:
        return get_worker()
    except ValueError:  # not in a task (Client.run in a thread): the process's one worker
        return next(iter(Worker._instances))


# -- the rendezvous store --------------------------------------------------------------------
class _StoreKeys:
    """One rendezvous generation's keys, kept on rank 0's worker and served over the Dask comm.

    Why not torch's ``TCPStore``: it has no authentication and listens on every
    interface, so another user of the machine (or of the network) could connect,
    read the gloo peers' addresses and write keys the ranks would trust (measured:
    the OS user ``nobody`` did both while a cell ran).  A random key prefix would
    not help, since anyone connected can still write and wait on keys.  The
    worker's Dask comm is already what the cluster trusts (TLS with this user's
    private certificate on a local cluster), so the keys travel over it and
    nothing new listens.  Touched only on the worker's event loop, so no lock.
    """

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.waiting: list[asyncio.Future] = []
        self.closed = False

    def close(self) -> None:
        self.closed = True
        self._changed()

    def _changed(self) -> None:
        waiting, self.waiting = self.waiting, []
        for fut in waiting:
            if not fut.done():
                fut.set_result(None)

    async def _until(self, keys: list[str], timeout: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self.closed and not all(k in self.data for k in keys):
            left = deadline - loop.time()
            if left <= 0:
                return False
            fut = loop.create_future()
            self.waiting.append(fut)
            try:
                await asyncio.wait_for(fut, left)
            except asyncio.TimeoutError:
                pass
        return not self.closed

    async def call(self, op: str, a: dict[str, Any]) -> Any:
        """One store operation, with ``c10d::HashStore``'s semantics."""
        data = self.data
        if op in ("get", "multi_get", "wait"):
            keys = a["keys"] if "keys" in a else [a["key"]]
            if not await self._until(keys, a["timeout"]):
                return _StoreTimeout
            return data[a["key"]] if op == "get" else [data[k] for k in keys] if op == "multi_get" else None
        if op == "check":
            return all(k in data for k in a["keys"])
        if op == "num_keys":
            return len(data)
        if op == "delete_key":
            return data.pop(a["key"], None) is not None
        value: Any = None
        if op == "set":
            data[a["key"]] = a["value"]
        elif op == "multi_set":
            data.update(zip(a["keys"], a["values"]))
        elif op == "add":
            value = int(data.get(a["key"], b"0")) + a["amount"]
            data[a["key"]] = str(value).encode()
        else:  # compare_set
            current = data.get(a["key"])
            if (current is None and not a["expected"]) or current == a["expected"]:
                data[a["key"]] = value = a["desired"]
            else:
                return a["expected"] if current is None else current
        self._changed()
        return value


#: what a waiting store operation answers when its keys did not come in time
_StoreTimeout = object()

#: each operation's arguments and their types: the wire input is checked against this, never evaluated
_STORE_OPS: dict[str, dict[str, type]] = {
    "set": {"key": str, "value": bytes},
    "multi_set": {"keys": list, "values": list},
    "get": {"key": str, "timeout": float},
    "multi_get": {"keys": list, "timeout": float},
    "wait": {"keys": list, "timeout": float},
    "check": {"keys": list},
    "add": {"key": str, "amount": int},
    "compare_set": {"key": str, "expected": bytes, "desired": bytes},
    "delete_key": {"key": str},
    "num_keys": {},
}


def _valid_store_call(op: Any, args: Any) -> bool:
    spec = _STORE_OPS.get(op) if isinstance(op, str) else None
    if spec is None or not isinstance(args, dict) or set(args) != set(spec):
        return False
    for name, kind in spec.items():
        value = args[name]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            args[name] = value = float(value)
        if kind is list and isinstance(value, tuple):  # Dask's msgpack reads sequences as tuples
            args[name] = value = list(value)
        if not isinstance(value, kind) or isinstance(value, bool):
            return False
    if "keys" in args and not all(isinstance(k, str) for k in args["keys"]):
        return False
    if "values" in args and (
        not all(isinstance(v, bytes) for v in args["values"]) or len(args["values"]) != len(args["keys"])
    ):
        return False
    return True


async def _serve_store(group: Any = None, generation: Any = None, call: Any = None, args: Any = None) -> dict:
    """The :data:`STORE_HANDLER` comm handler; also what rank 0 calls in-process.  Answers are data, never raised."""
    op = call  # not named `op`: that is the name of the comm message's own handler field
    if not _valid_store_call(op, args):
        return {"ok": False, "error": f"not a valid rendezvous store call: {op!r}"}
    keys = _STATE.stores.get((group, generation)) if isinstance(group, str) and isinstance(generation, int) else None
    if keys is None or keys.closed:
        return {"ok": False, "error": "gone"}
    value = await keys.call(op, args)
    if value is _StoreTimeout:
        return {"ok": False, "error": "gone" if keys.closed else "timeout"}
    return {"ok": True, "value": value}


_store_class: Any = None


def _cluster_store(worker, address: str, group: str, generation: int, timeout: float):
    """A ``torch.distributed.Store`` whose keys live on rank 0's worker (``address``), reached over the Dask comm.

    The class is made on first use so that this module imports without torch.
    """
    global _store_class
    if _store_class is None:
        import torch.distributed as dist

        class ClusterStore(dist.Store):
            """The rendezvous keys of one %%spmd group generation; see :class:`_StoreKeys`."""

            def __init__(self, worker, address: str, group: str, generation: int, timeout: float):
                super().__init__()
                self.set_timeout(datetime.timedelta(seconds=timeout))
                self._where = (worker, address, group, generation)

            def _call(self, op: str, **args: Any) -> Any:
                worker, address, group, generation = self._where
                return _store_call(worker, address, group, generation, op, args)

            def _wait_s(self, timeout: Any = None) -> float:
                # Store.timeout (torch's own property, set by set_timeout) is missing from torch's stubs
                own = typing.cast(Any, self).timeout
                return float((timeout if timeout is not None else own).total_seconds())

            def set(self, key: str, value: Any) -> None:
                self._call("set", key=key, value=_as_bytes(value))

            def multi_set(self, keys: list[str], values: list[Any]) -> None:
                self._call("multi_set", keys=list(keys), values=[_as_bytes(v) for v in values])

            def get(self, key: str) -> bytes:
                return self._call("get", key=key, timeout=self._wait_s())

            def multi_get(self, keys: list[str]) -> list[bytes]:
                return self._call("multi_get", keys=list(keys), timeout=self._wait_s())

            def wait(self, keys: list[str], timeout: Any = None) -> None:
                self._call("wait", keys=list(keys), timeout=self._wait_s(timeout))

            def check(self, keys: list[str]) -> bool:
                return self._call("check", keys=list(keys))

            def add(self, key: str, amount: int) -> int:
                return self._call("add", key=key, amount=int(amount))

            def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
                return self._call("compare_set", key=key, expected=_as_bytes(expected), desired=_as_bytes(desired))

            def delete_key(self, key: str) -> bool:
                return self._call("delete_key", key=key)

            def num_keys(self) -> int:
                return self._call("num_keys")

            def clone(self):
                return type(self)(*self._where, timeout=self._wait_s())

        _store_class = ClusterStore
    return _store_class(worker, address, group, generation, timeout)


def _as_bytes(value: Any) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def _store_call(worker, address: str, group: str, generation: int, op: str, args: dict[str, Any]) -> Any:
    """Run one store operation on rank 0's worker from a rank's thread (torch calls stores synchronously)."""
    import concurrent.futures

    msg = {"group": group, "generation": generation, "call": op, "args": args}
    loop = worker.loop.asyncio_loop
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:  # the usual case: a rank's thread
        running = None
    if running is loop:  # waiting here for the loop would block it for good
        raise RuntimeError("the %%spmd rendezvous store cannot be used from the worker's event loop")
    if address == worker.address:
        coro = _serve_store(**msg)
    else:

        async def coro_fn():
            return await getattr(worker.rpc(address), STORE_HANDLER)(**msg)

        coro = coro_fn()
    fut = asyncio.run_coroutine_threadsafe(coro, loop)
    deadline = time.monotonic() + float(args.get("timeout", 0.0)) + STORE_SLACK_S
    try:
        # short waits, so that an interrupt (KeyboardInterrupt raised in this thread) lands at once
        while True:
            try:
                reply = fut.result(timeout=0.1)
                break
            except concurrent.futures.TimeoutError:
                if time.monotonic() > deadline:
                    raise _store_error(f"rank 0's worker ({address}) did not answer a rendezvous call") from None
    except BaseException:
        fut.cancel()
        raise
    if reply.get("ok"):
        return reply.get("value")
    if reply.get("error") == "timeout":
        keys = args.get("keys") or [args.get("key")]
        raise _store_error(
            f"Timed out after {args.get('timeout', 0.0):g} s waiting for the rendezvous keys {keys} "
            "(a rank that never joined the %%spmd group?)"
        )
    if reply.get("error") == "gone":
        raise RuntimeError(
            "the rendezvous store of this %%spmd group is gone from rank 0's worker (restarted, or a newer cell "
            "began); rerun the cell"
        )
    raise RuntimeError(str(reply.get("error")))


def _store_error(text: str) -> Exception:
    import torch.distributed as dist

    return dist.DistStoreError(text)


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
        if var not in os.environ or os.environ[var] == _STATE.ifnames.get(var):
            os.environ[var] = _STATE.ifnames[var] = ifname


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
        gone = list(_STATE.stores.values())
        _STATE.stores.clear()
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
    if spec["rank"] == 0 and (spec["group"], spec["generation"]) not in st.stores:
        raise RuntimeError("the rendezvous store of this %%spmd group is gone from rank 0's worker (was it restarted?)")
    _bind_to_worker_interface(spec["bind"])
    store = st.store = _cluster_store(worker, spec["store"], spec["group"], spec["generation"], spec["timeout"])
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
    from ..engine.worker import error_info

    st = _STATE
    from ..engine.worker import install_thread_streams

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
