"""The rendezvous of an SPMD group, on the workers: its keys kept on rank 0's worker, reached over the Dask comm.

Each rendezvous generation (a new one after a failed or interrupted cell) has its
keys (:class:`_StoreKeys`) on rank 0's worker, served by the :data:`STORE_HANDLER`
comm handler; every rank's process group joins through a ``torch.distributed.Store``
whose calls go there (:func:`cluster_store`).  Nothing new listens: see
:class:`_StoreKeys` for why not torch's ``TCPStore``.  Runs inside Dask worker
processes; torch is imported only when a rank needs it.
"""

from __future__ import annotations

import asyncio
import datetime
import threading
import time
import typing
from typing import Any

#: the worker handler (Dask comm op) that serves a group's rendezvous keys from rank 0's worker
STORE_HANDLER = "jc_spmd_store"
#: what a store call may wait for its answer beyond the store's own timeout (the comm round trip)
STORE_SLACK_S = 30.0

# (group, generation) -> its keys, on rank 0's worker
_generations: dict[tuple[str, int], _StoreKeys] = {}
_generations_lock = threading.Lock()


def open_generation(worker: Any, group: str, generation: int) -> None:
    """Hold a new generation's keys on ``worker`` (rank 0's), served by its :data:`STORE_HANDLER`."""
    worker.handlers[STORE_HANDLER] = _serve_store
    with _generations_lock:
        # older generations' keys are not needed once a newer one exists; their waiting calls end now
        for key in [k for k in _generations if k[0] != group or k[1] < generation]:
            worker.loop.add_callback(_generations.pop(key).close)
        _generations[(group, generation)] = _StoreKeys()


def holds(group: str, generation: int) -> bool:
    """Whether this worker holds the keys of ``group``'s rendezvous ``generation``."""
    return (group, generation) in _generations


def forget_all() -> list[_StoreKeys]:
    """Drop every generation's keys; the caller closes them on the worker's event loop."""
    with _generations_lock:
        gone = list(_generations.values())
        _generations.clear()
    return gone


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
    keys = _generations.get((group, generation)) if isinstance(group, str) and isinstance(generation, int) else None
    if keys is None or keys.closed:
        return {"ok": False, "error": "gone"}
    value = await keys.call(op, args)
    if value is _StoreTimeout:
        return {"ok": False, "error": "gone" if keys.closed else "timeout"}
    return {"ok": True, "value": value}


_store_class: Any = None


def cluster_store(worker, address: str, group: str, generation: int, timeout: float):
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
