"""Running items: the worker half of every map, on either path.

:func:`run_chunk` loads the function once per worker process (cached by
token, so a notebook-defined class is rebuilt once, not per item; a
:class:`~jupyter_cluster.cell.function.CellFunction` is prepared here into a
:class:`PreparedCell`), runs each item in a fresh namespace (a cell's targets
bound, its last expression kept), captures ``print`` output per item and per
thread (bounded), times each item, applies ``--retries`` (stopping when
cancelled) and ``--timeout``, and returns failures as data (exception,
traceback text, frames) instead of failing the whole batch.
"""

from __future__ import annotations

import contextvars
import io
import pickle
import queue
import sys
import threading
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import cloudpickle

from ...cell.function import ITEM_NAME, RESULT_NAME, CellFunction
from ...telemetry.tags import item_state
from ..protocol import Items, MapRun, PackedResult, pack_plain
from . import groups, slices
from .groups import GroupStopped, _async_raise, _group, run_in_group
from .items import MAX_OUTPUT_CHARS, ItemsRun  # noqa: F401  (MAX_OUTPUT_CHARS: its old home)

_CANCEL_CHECK_S = 0.05


class PreparedCell:
    """A compiled cell with its captured values, as cached on a worker."""

    def __init__(self, code, values: dict[str, Any], persistent: bool, tag: Any = None):
        self.code = code
        self.values = values
        self.persistent = persistent
        self.tag = tag  # the run's ItemTag (CellFunction.tag): each item runs inside it

    @classmethod
    def of(cls, cell: CellFunction) -> PreparedCell:
        """Prepare ``cell`` on this worker: compiled, its modules imported, its small values unpickled."""
        values = cell.load_values()
        return cls(cell.compile(), values, cell.persistent, getattr(cell, "tag", None))

    def bind(self, big: dict[str, Any] | None) -> Callable[[Any], Any]:
        """A per-item callable; ``big`` holds the large values sent once per worker."""
        code = self.code
        base = dict(worker_namespace()) if not self.persistent else None
        captured = dict(self.values)
        if big:
            captured.update(big)
        if self.persistent:
            ns = worker_namespace()

            def run_persistent(item):
                ns.update(captured)
                ns[ITEM_NAME] = item
                try:
                    exec(code, ns)
                    return ns.pop(RESULT_NAME, None)
                finally:
                    ns.pop(ITEM_NAME, None)
                    ns.pop(RESULT_NAME, None)

            return run_persistent
        assert base is not None  # made above for a cell that is not persistent
        base.update(captured)
        base.setdefault("__name__", "__main__")

        tag = self.tag
        if tag is not None:  # a %%parallel sweep: report() in the item's cell names its run and item

            def run_tagged(item):
                ns = base.copy()
                ns[ITEM_NAME] = item
                item_state.ctx = [tag, item, id(ns), None]
                try:
                    exec(code, ns)
                finally:
                    item_state.ctx = None
                return ns.get(RESULT_NAME)

            return run_tagged

        def run(item):
            ns = base.copy()
            ns[ITEM_NAME] = item
            exec(code, ns)
            return ns.get(RESULT_NAME)

        return run


# -- worker process state ----------------------------------------------------------
class _WorkerState:
    """State that lives as long as the worker process."""

    def __init__(self):
        self.namespace: dict[str, Any] = {"__name__": "__main__"}
        self.cache: OrderedDict[str, Any] = OrderedDict()
        self.lock = threading.Lock()
        self.local = threading.local()
        self.streams_installed = False


_STATE = _WorkerState()


def worker_namespace() -> dict[str, Any]:
    """The worker process's persistent namespace (filled by ``--all-workers`` cells)."""
    return _STATE.namespace


class ThreadStream(io.TextIOBase):
    """Sends writes to the current thread's capture buffer (``local.buf``), or to the real stream."""

    def __init__(self, real, local: threading.local):
        self._real = real
        self._local = local

    def write(self, s):
        cap = getattr(self._local, "buf", None)
        if cap is not None:
            return cap.write(s)
        return self._real.write(s)

    def flush(self):
        if getattr(self._local, "buf", None) is None:
            self._real.flush()

    def __getattr__(self, name):
        return getattr(self._real, name)


def install_thread_streams(state: Any) -> None:
    """Wrap ``sys.stdout``/``sys.stderr`` once per process for ``state`` (its ``local``, ``lock``
    and ``streams_installed``), so a thread that sets ``state.local.buf`` captures its own prints.

    Per-thread redirection: a worker with several threads runs several items (or a
    ``%%spmd`` rank beside map items) at once, and contextlib.redirect_stdout would mix
    their output.
    """
    with state.lock:
        if not state.streams_installed:
            sys.stdout = ThreadStream(sys.stdout, state.local)
            sys.stderr = ThreadStream(sys.stderr, state.local)
            state.streams_installed = True


def load(token: str, blob: bytes | None, big: dict[str, Any] | None):
    """The callable for ``token``: unpickled (and prepared) once per worker process."""
    with _STATE.lock:
        obj = _STATE.cache.get(token)
        if obj is not None:
            _STATE.cache.move_to_end(token)
    if obj is None:
        if blob is not None:
            obj = cloudpickle.loads(blob)
        else:
            assert big is not None  # the function itself travelled among the large values
            obj = big.pop("__fn__")
        if isinstance(obj, CellFunction):
            obj = PreparedCell.of(obj)  # compiled, modules imported, small values unpickled: once per process
        with _STATE.lock:
            _STATE.cache[token] = obj
            while len(_STATE.cache) > 16:
                _STATE.cache.popitem(last=False)
    if isinstance(obj, PreparedCell):
        return obj.bind({k: v for k, v in (big or {}).items() if k != "__fn__"})
    return obj


# -- errors as data ----------------------------------------------------------------------
#: The files whose frames run items (this one, the slices, the stop groups' helper thread): left out of tracebacks.
_OWN_FILES = frozenset({__file__, groups.__file__, slices.__file__})


def _cell_tb(tb):
    """Skip our own frames: start the traceback at the first frame of the cell or the user's function."""
    first = tb
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_filename not in _OWN_FILES:
            return tb
        tb = tb.tb_next
    return first


def _add_first_lines(frames: dict | None, tb) -> None:
    """Record what tblib leaves out of each frame's code and the notebook needs to show it.

    ``co_firstlineno`` (IPython's renderer in a kernel counts a frame's
    context lines from it), ``co_qualname`` and the parameter names (its
    ``in f(x)`` heading).
    """
    while frames is not None and tb is not None:
        code = tb.tb_frame.f_code
        info = frames["tb_frame"]["f_code"]
        info["co_firstlineno"] = code.co_firstlineno
        info["co_qualname"] = getattr(code, "co_qualname", code.co_name)
        n, k = code.co_argcount, code.co_kwonlyargcount
        names = code.co_varnames
        info["co_params"] = {
            "args": list(names[:n]),
            "kwonly": list(names[n : n + k]),
            "varargs": names[n + k] if code.co_flags & 0x04 else None,
            "varkw": names[n + k + bool(code.co_flags & 0x04)] if code.co_flags & 0x08 else None,
        }
        frames, tb = frames.get("tb_next"), tb.tb_next


def error_info(exc: BaseException) -> tuple:
    """An :class:`..protocol.ItemError`'s fields as a plain tuple (the client reads it with ``ItemError._make``).

    ``(exception or None, type name, message, traceback text, frames dict or None)``.
    """
    tb = _cell_tb(exc.__traceback__)
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    try:
        pickle.dumps(exc)
        sendable = exc
    except Exception:
        try:
            cloudpickle.dumps(exc)
            sendable = exc
        except Exception:
            sendable = None
    frames = None
    try:
        from tblib import Traceback

        frames = Traceback(tb).to_dict() if tb is not None else None
    except Exception:  # tblib is optional; the text is enough
        frames = None
    _add_first_lines(frames, tb)
    return (sendable, type(exc).__qualname__, str(exc), text, frames)


class ItemTimeout(TimeoutError):
    """Raised for an item that ran longer than ``timeout`` seconds."""


class _TimedRunner:
    """Runs items in a helper thread so an item over its time limit can be abandoned."""

    def __init__(self, timeout: float):
        self.timeout = timeout
        self.thread: threading.Thread | None = None
        self.jobs: queue.Queue = queue.Queue()

    def _start(self) -> threading.Thread:
        self.jobs = queue.Queue()
        thread = threading.Thread(target=self._loop, args=(self.jobs,), daemon=True, name="jupyter-cluster-item")
        thread.start()
        self.thread = thread
        return thread

    def _loop(self, jobs):
        while True:
            job = jobs.get()
            if job is None:
                return
            call, args, done, box, buf, ctx = job
            _STATE.local.buf = buf
            try:
                box.append((True, ctx.run(call, *args)))  # the caller's context: get_worker() works
            except BaseException as exc:  # noqa: BLE001 - every item failure is data
                box.append((False, exc))
            finally:
                _STATE.local.buf = None
                done.set()

    def run(self, call, args, buf):
        thread = self.thread if self.thread is not None else self._start()
        done = threading.Event()
        box: list[tuple[bool, Any]] = []
        self.jobs.put((call, args, done, box, buf, contextvars.copy_context()))
        if not done.wait(self.timeout):
            # Abandon the thread: ask it to stop (Python code stops at once, a
            # blocking C call when it returns) and use a fresh one next time.
            _async_raise(thread, ItemTimeout)
            self.jobs.put(None)
            self.thread = None
            raise ItemTimeout(f"the item ran longer than the --timeout of {self.timeout:g} s")
        ok, value = box[0]
        if ok:
            return value
        raise value

    def close(self):
        if self.thread is not None:
            self.jobs.put(None)


def _cancel_checker() -> Callable[[], bool]:
    """A cheap 'was this task cancelled?' test, checked between items."""
    try:
        from distributed import get_worker

        worker = get_worker()
        key = worker.get_current_task()
    except Exception:  # not on a worker (tests, local execution)
        return lambda: False

    def cancelled() -> bool:
        ts = worker.state.tasks.get(key)
        return ts is None or ts.state not in ("executing", "long-running")

    return cancelled


def _worker_address() -> str | None:
    try:
        from distributed import get_worker

        return get_worker().address
    except Exception:
        return None


def run_chunk(
    run: MapRun,
    items: list,
    big: dict[str, Any] | None = None,
    *,
    budget: float | None = None,
    group: str | None = None,
    packed: bool = False,
) -> Any:
    """Run one chunk of items on a worker: the one place a :class:`..protocol.MapRun` is unpacked.

    Parameters
    ----------
    run : MapRun
        The map's function (its cache key ``token``, its pickle ``blob``:
        None when this worker process has it or it travels in
        ``big["__fn__"]`` because it is large), ``star`` (call
        ``fn(*item)``), ``retries``, ``timeout`` and ``capture``.
    items : list
        The chunk's items (argument tuples when ``star``).
    big : dict or None
        Large values, sent once per worker (Dask resolves them to local data).
    budget : float or None
        Stop after the item that takes the chunk past this many seconds;
        the engine sends the items left over again.
    group : str or None
        The stop group the items run in (a lease's id: the map's stop ends
        them at once, :mod:`.groups`); a ``Pool`` task's function names its own.
    packed : bool
        Return the result packed for the comm (:class:`..protocol.PackedResult`),
        in this thread (a lease's), when plain pickle takes the whole result:
        that pickle is also the check that every value can be sent back, and
        the value-by-value check is skipped (its type scan cost 2 ms per 10^5
        results, a sixth of a 10^6-item map's worker CPU, issue 36).  Else the
        values are checked and the tuple returned, for the handler to pack.

    Returns
    -------
    tuple
        A :class:`..protocol.ChunkResult`'s fields as a plain tuple (the
        client reads it with ``ChunkResult._make``): ``(values, timings,
        outputs, errors, worker, started)``; ``timings`` is runs of ``(items,
        seconds each)`` in item order (:mod:`.items`), ``outputs`` maps
        position -> printed text, ``errors`` maps position -> :func:`error_info`
        (None when empty); ``started`` is the chunk's ``time.time()`` start.
        Fewer values than items means the chunk stopped early (its budget ran
        out, or its task was cancelled).
    """
    started = time.time()
    worker = _worker_address()
    big = dict(big) if big else None
    try:
        fn = load(run.token, run.blob, big)
    except BaseException as exc:  # noqa: BLE001 - a setup failure is reported for every item
        info = error_info(exc)
        return ([None] * len(items), [(len(items), 0.0)], None, {i: info for i in range(len(items))}, worker, started)
    if run.capture:
        install_thread_streams(_STATE)
    now = time.perf_counter()
    # A Pool's task: terminate() stops it; any other lease batch: the map's stop (jc_close) does (run_in_group).
    group = getattr(fn, "stop_group", None) or group
    chunk = ItemsRun(
        fn,
        items,
        star=run.star,
        retries=run.retries,
        runner=_TimedRunner(run.timeout) if run.timeout else None,
        cancelled=_cancel_checker(),
        stop=_group(group).stopped if group is not None else None,
        deadline=now + budget if budget else float("inf"),
        next_check=now + _CANCEL_CHECK_S,
        capture=run.capture,
        error_info=error_info,
    )
    complete = True
    if group is None:
        _run_items(chunk)
    else:
        try:
            run_in_group(group, _run_items, chunk)
        except GroupStopped:
            groups.mark_stopped()  # the lease running this chunk ends (see groups.took_stop)
            complete = False  # the helper may still be adding the item it was in: keep what was complete
    if packed:
        try:
            data = pack_plain(chunk.result(worker, started, complete))
        except Exception:  # noqa: BLE001 - checked and packed as before (the handler reports what fails)
            data = None
        if data is not None:
            return PackedResult(data)
    _check_results(chunk.values, chunk.errors, getattr(fn, "check_result", None))
    return chunk.result(worker, started, complete)  # protocol.ChunkResult's fields


def _run_items(chunk: ItemsRun) -> None:
    """:func:`run_chunk`'s loop over its items: one at a time, then (quick ones) in slices (:mod:`.slices`)."""
    local = _STATE.local  # per thread: run_in_group runs this in a helper thread
    perf = time.perf_counter
    fn, items, star, retries, runner = chunk.fn, chunk.items, chunk.star, chunk.retries, chunk.runner
    values, timings, errors, outputs, stop = chunk.values, chunk.timings, chunk.errors, chunk.outputs, chunk.stop
    # Quick items run in slices once the first ones are timed (see .slices); not with retries or timeouts.
    quick_from = slices.FIRST_ITEMS if not retries and runner is None and isinstance(items, (list, tuple)) else 0
    if len(items) <= 2 * quick_from:
        quick_from = 0
    local.buf = outputs  # for the whole chunk: a write is filed under the item running then
    try:
        for pos, item in enumerate(items):
            if stop is not None and stop.is_set():  # Pool.terminate(): the rest of the chunk is not run
                break
            args = item if star else (item,)
            t0 = perf()
            stopped = False
            for attempt in range(retries + 1):
                if attempt:
                    # A retry storm (retries=10**9 on an item that always
                    # raises) must still stop when the map is cancelled, and
                    # its output must stay bounded: only the last attempt's is kept.
                    if perf() >= chunk.next_check:
                        chunk.next_check = perf() + _CANCEL_CHECK_S
                        if chunk.cancelled():
                            stopped = True
                            break
                    if outputs is not None:
                        outputs.restart()
                        outputs.write(f"--- retry {attempt} of {retries} ---\n")
                try:
                    if runner is not None:
                        value = runner.run(fn, args, outputs.of(pos) if outputs is not None else None)
                    else:
                        value = fn(*args)
                except BaseException as exc:  # noqa: BLE001 - every item failure is data
                    if attempt < retries and not isinstance(exc, ItemTimeout):
                        continue
                    errors[pos] = error_info(exc)
                    value = None
                break
            if stopped:  # cancelled between retries: the item counts as not run
                break
            t1 = perf()
            values.append(value)
            timings.append((1, t1 - t0))
            if t1 >= chunk.deadline:
                break
            if t1 >= chunk.next_check:
                chunk.next_check = t1 + _CANCEL_CHECK_S
                if chunk.cancelled():
                    break
            if pos + 1 == quick_from:
                spent = sum(d for _, d in timings)
                if spent < slices.QUICK_ITEM_SECONDS * quick_from:
                    slices.run_slices(chunk, spent / quick_from)
                    break
    finally:
        local.buf = None
        if runner is not None:
            runner.close()


#: Result types Dask can always send back; a chunk holding only these skips the check.
_SENDABLE = frozenset({type(None), bool, int, float, complex, str, bytes})


def _check_results(values: list, errors: dict, check: Callable[[Any], BaseException | None] | None = None) -> None:
    """Replace results that cannot be sent back by an error for that item.

    Pickling every chunk's values here doubled the cost of large results, so
    scalars are trusted and only chunks holding something else are tried.
    ``check(value)``, when the function has one (a ``Pool``'s task: its own
    rules and error, ``MaybeEncodingError``), says what is wrong with a value.
    """
    sendable = _SENDABLE
    if sendable.issuperset(map(type, values)):  # in C: 10^5 results cost a few ms, not a Python loop
        return
    if check is not None:
        for pos, value in enumerate(values):
            if type(value) not in sendable and pos not in errors:
                problem = check(value)
                if problem is not None:
                    errors[pos] = error_info(problem)
                    values[pos] = None
        return
    try:
        pickle.dumps(values, protocol=5, buffer_callback=lambda b: None)
        return
    except Exception:
        pass
    for pos, value in enumerate(values):
        try:
            cloudpickle.dumps(value, protocol=5, buffer_callback=lambda b: None)
        except Exception as exc:
            err = TypeError(
                f"the item's result ({type(value).__qualname__}) cannot be sent back to the notebook: {exc}; return something picklable (e.g. a list instead of a generator)."
            )
            errors[pos] = error_info(err)
            values[pos] = None


def run_items(packed: Items, run: MapRun, big: dict | None = None) -> tuple:
    """The task path's task: :func:`run_chunk` on the items (and time budget) of ``packed``."""
    return run_chunk(MapRun.of(run), packed.items, big, budget=packed.budget)
