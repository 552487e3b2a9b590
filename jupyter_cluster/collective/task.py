"""The task each rank runs: the cell (or function) in the rank's namespace, its output streamed, failures as data.

:func:`run_rank` is what the client submits once per rank, pinned to the rank's
worker (pickled by reference).  It joins (or keeps) the rank's process group
(:func:`~jupyter_cluster.collective.worker._ensure_group`), runs the cell, and
returns a dict whether the cell succeeded or not: a failed rank destroys its
process group at once, which releases every peer blocked in a collective with it.
"""

from __future__ import annotations

import gc
import io
import os
import threading
import time
import traceback
from typing import Any

from ..cell.function import RESULT_NAME
from ..telemetry.topic_names import SPMD_OUTPUT_TOPIC as OUTPUT_TOPIC
from . import worker as _rank_setup
from .worker import _STATE, _destroy_process_group, _ensure_group

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
#: the modules whose frames lead a rank's traceback before the cell's own: dropped from what the notebook shows
_OWN_FILES = frozenset({__file__, _rank_setup.__file__})


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


# -- the cell ----------------------------------------------------------------------------
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
    """Start the traceback at the cell (or the user's function): drop the frames of the rank's own modules."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in _OWN_FILES:
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


# -- the task ----------------------------------------------------------------------------
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
