"""Turn a cell body plus captured values into work a Dask worker runs item by item.

Client side, :class:`CellFunction` holds the cell's text, targets, the modules
to import and the small captured values (already pickled); it is small and is
pickled once per map.  Worker side, :func:`run_chunk` runs one chunk of items:
it loads the function once per worker process (cached by token, so a
notebook-defined class is rebuilt once, not per item), binds the targets, runs
the body in a fresh namespace per item, keeps the value of the final
expression, captures ``print`` output per item, times each item and returns
failures as data (exception, traceback text, frames) instead of failing the
whole chunk.

The body is compiled with the notebook's own cell filename and line numbers,
and the cell text is put in the worker's ``linecache``, so remote tracebacks
point at the cell's lines and show their source.

Only the standard library, cloudpickle and distributed are used here, because
this module runs inside worker processes.
"""

from __future__ import annotations

import ast
import importlib
import io
import linecache
import pickle
import sys
import threading
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import cloudpickle

ITEM_NAME = "__jc_item__"
RESULT_NAME = "__jc_result__"
_CANCEL_CHECK_S = 0.05
#: Most characters of printed output kept per item (the rest is counted and dropped).
MAX_OUTPUT_CHARS = 1_000_000


class CellFunction:
    """A ``%%parallel`` cell body, ready to be pickled and run per item on workers.

    Parameters
    ----------
    body : str
        The cell body (the lines below ``%%parallel``).
    targets : str or None
        Assignment target source, e.g. ``"lr, depth"``; None for ``--all-workers`` cells.
    filename : str
        Filename the body is compiled under (the notebook's cell name), so
        tracebacks show the cell's lines.
    first_line : int
        Cell line number of the body's first line.
    cell_text : str
        The whole cell, for the worker's ``linecache``.
    modules : dict
        Variable name -> module name, imported by name on the worker.
    small : dict
        Variable name -> pickled value, sent with the function.
    persistent : bool
        Run in the worker's persistent namespace (``--all-workers``): names the
        cell assigns stay there for later cells.
    """

    def __init__(
        self,
        body: str,
        targets: str | None = None,
        filename: str = "<cell>",
        first_line: int = 2,
        cell_text: str | None = None,
        modules: dict[str, str] | None = None,
        small: dict[str, bytes] | None = None,
        persistent: bool = False,
    ):
        self.body = body
        self.targets = targets
        self.filename = filename
        self.first_line = first_line
        self.cell_text = cell_text if cell_text is not None else "\n" * (first_line - 1) + body
        self.modules = dict(modules or {})
        self.small = dict(small or {})
        self.persistent = persistent

    def compile(self):
        """Compile the body: bind targets from ``__jc_item__``, keep the last expression's value."""
        tree = ast.parse(self.body, filename=self.filename, mode="exec")
        ast.increment_lineno(tree, self.first_line - 1)
        stmts = list(tree.body)
        if stmts and isinstance(stmts[-1], ast.Expr):
            last = stmts[-1]
            stmts[-1] = ast.copy_location(
                ast.Assign(targets=[ast.Name(RESULT_NAME, ast.Store())], value=last.value), last
            )
        if self.targets is not None:
            target = ast.parse(f"{self.targets} = {ITEM_NAME}", mode="exec").body[0]
            ast.increment_lineno(target, max(self.first_line - 2, 0))
            stmts.insert(0, target)
        tree.body = stmts
        ast.fix_missing_locations(tree)
        return compile(tree, self.filename, "exec", dont_inherit=True)

    def prepare(self) -> _PreparedCell:
        """Worker side: compile, import modules, unpickle small values (once per worker)."""
        lines = self.cell_text.splitlines(True)
        linecache.cache[self.filename] = (len(self.cell_text), None, lines, self.filename)
        values: dict[str, Any] = {}
        for name, modname in self.modules.items():
            try:
                values[name] = importlib.import_module(modname)
            except ImportError as exc:
                raise ImportError(
                    f"module {modname!r} (imported in the notebook as `{name}`) cannot be imported on this worker: {exc}; install it on the workers."
                ) from None
        for name, data in self.small.items():
            values[name] = cloudpickle.loads(data)
        return _PreparedCell(self.compile(), values, self.persistent)


class _PreparedCell:
    """A compiled cell with its captured values, as cached on a worker."""

    def __init__(self, code, values: dict[str, Any], persistent: bool):
        self.code = code
        self.values = values
        self.persistent = persistent

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
        base.update(captured)
        base.setdefault("__name__", "__main__")

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


class _Capture:
    """One item's captured output; the buffer is made on the first write.

    Most items print nothing, and a ``StringIO`` per item was half of the
    worker's cost per no-op item.
    """

    __slots__ = ("buf", "size")

    def __init__(self):
        self.buf = None
        self.size = 0

    def write(self, s: str) -> int:
        if self.buf is None:
            self.buf = io.StringIO()
        n = len(s)
        if self.size < MAX_OUTPUT_CHARS:
            room = MAX_OUTPUT_CHARS - self.size
            self.buf.write(
                s
                if n <= room
                else s[:room] + f"\n[jupyter_cluster: output beyond {MAX_OUTPUT_CHARS:,} characters dropped]\n"
            )
        self.size += n
        return n

    def clear(self) -> None:
        """Forget what was written (a retried item keeps only its last attempt's output)."""
        self.buf = None
        self.size = 0

    def getvalue(self) -> str:
        return self.buf.getvalue() if self.buf is not None else ""


class _ThreadStream(io.TextIOBase):
    """Sends writes to the current thread's capture buffer, or to the real stream."""

    def __init__(self, real):
        self._real = real

    def write(self, s):
        cap = getattr(_STATE.local, "buf", None)
        if cap is not None:
            return cap.write(s)
        return self._real.write(s)

    def flush(self):
        if getattr(_STATE.local, "buf", None) is None:
            self._real.flush()

    def __getattr__(self, name):
        return getattr(self._real, name)


def _install_streams() -> None:
    # Per-thread redirection: a worker with several threads runs several items
    # at once, and contextlib.redirect_stdout would mix their output.
    with _STATE.lock:
        if not _STATE.streams_installed:
            sys.stdout = _ThreadStream(sys.stdout)
            sys.stderr = _ThreadStream(sys.stderr)
            _STATE.streams_installed = True


def load(token: str, blob: bytes | None, big: dict[str, Any] | None):
    """The callable for ``token``: unpickled (and prepared) once per worker process."""
    with _STATE.lock:
        obj = _STATE.cache.get(token)
        if obj is not None:
            _STATE.cache.move_to_end(token)
    if obj is None:
        obj = cloudpickle.loads(blob) if blob is not None else big.pop("__fn__")
        if isinstance(obj, CellFunction):
            obj = obj.prepare()
        with _STATE.lock:
            _STATE.cache[token] = obj
            while len(_STATE.cache) > 16:
                _STATE.cache.popitem(last=False)
    if isinstance(obj, _PreparedCell):
        return obj.bind({k: v for k, v in (big or {}).items() if k != "__fn__"})
    return obj


# -- errors as data ----------------------------------------------------------------------
def _cell_tb(tb):
    """Skip our own frames: start the traceback at the first frame of the cell or the user's function."""
    first = tb
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_filename != __file__:
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
    """``(exception or None, type name, message, traceback text, frames dict or None)``."""
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


def _async_raise(thread: threading.Thread, exc_type) -> None:
    import ctypes

    if thread.ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(exc_type))


class _TimedRunner:
    """Runs items in a helper thread so an item over its time limit can be abandoned."""

    def __init__(self, timeout: float):
        self.timeout = timeout
        self.thread = None
        self.jobs = None

    def _start(self):
        import queue

        self.jobs = queue.Queue()
        self.thread = threading.Thread(target=self._loop, args=(self.jobs,), daemon=True, name="jupyter-cluster-item")
        self.thread.start()

    def _loop(self, jobs):
        while True:
            job = jobs.get()
            if job is None:
                return
            call, args, done, box, buf = job
            _STATE.local.buf = buf
            try:
                box.append((True, call(*args)))
            except BaseException as exc:  # noqa: BLE001 - every item failure is data
                box.append((False, exc))
            finally:
                _STATE.local.buf = None
                done.set()

    def run(self, call, args, buf):
        if self.thread is None:
            self._start()
        done, box = threading.Event(), []
        self.jobs.put((call, args, done, box, buf))
        if not done.wait(self.timeout):
            # Abandon the thread: ask it to stop (Python code stops at once, a
            # blocking C call when it returns) and use a fresh one next time.
            _async_raise(self.thread, ItemTimeout)
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
    token: str, blob: bytes | None, big: dict[str, Any] | None, items: list, star: bool, options: dict
) -> tuple:
    """Run one chunk of items on a worker.

    Parameters
    ----------
    token : str
        Cache key of the function (the map's id).
    blob : bytes or None
        cloudpickle of the function or :class:`CellFunction`; None when it
        travels in ``big["__fn__"]`` because it is large.
    big : dict or None
        Large values, sent once per worker (Dask resolves them to local data).
    items : list
        The chunk's items (argument tuples when ``star``).
    star : bool
        Call ``fn(*item)`` instead of ``fn(item)``.
    options : dict
        ``retries`` (int), ``timeout`` (float or None), ``capture`` (bool),
        ``budget`` (float or None: stop after the item that takes the chunk
        past this many seconds; the engine sends the items left over again).

    Returns
    -------
    tuple
        ``(values, durations, outputs, errors, worker, started)``: ``outputs`` maps
        position -> printed text, ``errors`` maps position -> :func:`error_info`
        (None when empty); ``started`` is the chunk's ``time.time()`` start.
        Fewer values than items means the chunk stopped early (its budget ran
        out, or its task was cancelled).
    """
    started = time.time()
    retries = options.get("retries", 0)
    timeout = options.get("timeout")
    capture = options.get("capture", True)
    budget = options.get("budget")
    worker = _worker_address()
    big = dict(big) if big else None
    try:
        fn = load(token, blob, big)
    except BaseException as exc:  # noqa: BLE001 - a setup failure is reported for every item
        info = error_info(exc)
        return ([None] * len(items), [0.0] * len(items), None, {i: info for i in range(len(items))}, worker, started)
    if capture:
        _install_streams()
    cancelled = _cancel_checker()
    runner = _TimedRunner(timeout) if timeout else None
    local = _STATE.local
    perf = time.perf_counter
    values: list = []
    durations: list = []
    outputs: dict[int, str] = {}
    errors: dict[int, tuple] = {}
    t_begin = perf()
    next_check = t_begin + _CANCEL_CHECK_S
    deadline = t_begin + budget if budget else float("inf")
    try:
        for pos, item in enumerate(items):
            args = item if star else (item,)
            buf = _Capture() if capture else None
            t0 = perf()
            stopped = False
            for attempt in range(retries + 1):
                if attempt:
                    # A retry storm (retries=10**9 on an item that always
                    # raises) must still stop when the map is cancelled, and
                    # its output must stay bounded: only the last attempt's is kept.
                    if perf() >= next_check:
                        next_check = perf() + _CANCEL_CHECK_S
                        if cancelled():
                            stopped = True
                            break
                    if buf is not None:
                        buf.clear()
                        buf.write(f"--- retry {attempt} of {retries} ---\n")
                try:
                    if runner is not None:
                        value = runner.run(fn, args, buf)
                    else:
                        local.buf = buf
                        try:
                            value = fn(*args)
                        finally:
                            local.buf = None
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
            durations.append(t1 - t0)
            if buf is not None:
                text = buf.getvalue()
                if text:
                    outputs[pos] = text
            if t1 >= deadline:
                break
            if t1 >= next_check:
                next_check = t1 + _CANCEL_CHECK_S
                if cancelled():
                    break
    finally:
        if runner is not None:
            runner.close()
    _check_results(values, errors)
    return (values, durations, outputs or None, errors or None, worker, started)


#: Result types Dask can always send back; a chunk holding only these skips the check.
_SENDABLE = frozenset({type(None), bool, int, float, complex, str, bytes})


def _check_results(values: list, errors: dict) -> None:
    """Replace results that cannot be sent back by an error for that item.

    Pickling every chunk's values here doubled the cost of large results, so
    scalars are trusted and only chunks holding something else are tried.
    """
    sendable = _SENDABLE
    if all(type(v) in sendable for v in values):
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
