"""``multiprocessing.Process`` on the cluster: the target runs as a long-running task on a worker.

The task secedes at once, so a ``Process`` holds none of the threads a map
or a pool needs (any number of them run at once, as processes would), and
runs its target in a stop group (:mod:`jupyter_cluster.engine.worker.groups`)
so that ``terminate()``/``kill()`` stop it at once.  ``pid`` is the worker
process's OS pid (on the worker's host), known once the target has started.
"""

from __future__ import annotations

import contextvars
import itertools
import os
import sys
import threading
import traceback
import uuid
from typing import Any

import cloudpickle

from .queue import Queue as ClusterQueue
from .shared import Shared

_counter = itertools.count(1)
#: The Process whose target runs in this context (a task's helper thread), for current_process().
_current: contextvars.ContextVar[Process | None] = contextvars.ContextVar("jupyter_cluster_process", default=None)
#: Processes started by this process and not yet seen to end (active_children()).
_children: set[Process] = set()
_children_lock = threading.Lock()

#: Exit codes of a process stopped by terminate() and kill(), as multiprocessing reports them.
SIGTERM_EXIT, SIGKILL_EXIT = -15, -9


class Process(Shared):
    """A ``multiprocessing.Process`` whose target runs on a worker of the cluster.

    Same constructor and methods: ``start``, ``run`` (override it in a
    subclass), ``join(timeout)``, ``is_alive``, ``terminate``, ``kill``,
    ``close``, and the ``name``, ``daemon``, ``pid``, ``ident``, ``exitcode``
    attributes.  The object is pickled (cloudpickle) and sent to the worker;
    an exception in the target prints its traceback here and gives exit code 1.
    """

    _prefix = "process"

    def __init__(
        self,
        group: None = None,
        target: Any = None,
        name: str | None = None,
        args: tuple = (),
        kwargs: dict | None = None,
        *,
        daemon: bool | None = None,
        client: Any = None,
    ):
        if group is not None:
            raise AssertionError("group argument must be None for now")
        count = next(_counter)
        self._target = target
        self._args = tuple(args)
        self._kwargs = dict(kwargs or {})
        self._pname = name or f"{type(self).__name__}-{count}"
        self._daemonic = bool(daemon) if daemon is not None else False
        self._start_client = client
        self._future: Any = None
        self._exitcode: int | None = None
        self._popen_pid: int | None = None
        self._key: str | None = None
        self._closed = False

    # -- what runs where -------------------------------------------------------------------
    def run(self) -> None:
        """What the process does: calls ``target(*args, **kwargs)``; override it in a subclass."""
        if getattr(self, "_target", None):
            self._target(*self._args, **self._kwargs)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for field in ("_client", "_future", "_start_client", "_drain"):
            state[field] = None
        return state

    def start(self) -> None:
        """Start the process: its ``run()`` is sent to a worker as a task."""
        if self._closed:
            raise ValueError("process object is closed")
        if self._future is not None or self._key is not None:
            raise AssertionError("cannot start a process twice")
        # The task's key: Dask and the dashboard name it after the process.
        self._bind(self._start_client, name=f"{self._pname}-{uuid.uuid4().hex[:8]}")
        self._key = self._name
        from ..engine.cluster import submit_call  # the engine's one way to send a call

        # What the target prints comes back here, line by line, as multiprocessing's children share our stdout.
        self._output = ClusterQueue(client=self._client)
        self._drain: threading.Thread | None = threading.Thread(
            target=_print_output, args=(self._output,), daemon=True, name=f"jupyter-cluster-{self._key}-output"
        )
        self._drain.start()
        blob = cloudpickle.dumps(self)
        # As multiprocessing: the parent drops its references to what the target holds.
        del self._target, self._args, self._kwargs
        self._future = submit_call(self._client, _run_process, blob, self._key, key=self._key, on_done=_ignore)
        with _children_lock:
            _children.add(self)

    # -- state -----------------------------------------------------------------------------
    def _check_closed(self) -> None:
        if self._closed:
            raise ValueError("process object is closed")

    def _poll(self, timeout: float | None = 0.0) -> int | None:
        """The exit code once the task has ended (waiting up to ``timeout``), else None."""
        if self._exitcode is not None or self._future is None:
            return self._exitcode
        if not self._future.done():
            if timeout == 0:
                return None
            try:
                self._future.result(timeout=timeout)
            except TimeoutError:
                return None
            except BaseException:  # noqa: BLE001 - cancelled or lost: _outcome says how it ended
                pass
        if self._exitcode is None:
            self._exitcode = self._outcome()
            self._end_output()
        with _children_lock:
            _children.discard(self)
        return self._exitcode

    def _outcome(self) -> int:
        try:
            code, text = self._future.result()
        except BaseException:  # cancelled or lost with its worker
            return SIGTERM_EXIT
        if text:  # multiprocessing prints the child's traceback in its stderr; ours shows here
            sys.stderr.write(text)
            sys.stderr.flush()
        return code

    def _end_output(self, stopped: bool = False) -> None:
        """Wait (briefly) until what the target printed is shown here, then drop the output channel."""
        drain, output = getattr(self, "_drain", None), getattr(self, "_output", None)
        if drain is None or output is None:
            return
        if stopped:
            try:
                output.put(_END)
            except Exception:  # the cluster is gone: nothing more will come
                pass
        drain.join(OUTPUT_WAIT_SECONDS)
        output.close()
        self._drain = None

    def join(self, timeout: float | None = None) -> None:
        """Wait until the process ends (or ``timeout`` seconds pass)."""
        self._check_closed()
        if self._future is None:
            raise AssertionError("can only join a started process")
        self._poll(None if timeout is None else max(timeout, 0.0) or 1e-3)

    def is_alive(self) -> bool:
        """Whether the process has started and not ended."""
        self._check_closed()
        if self._future is None:
            return False
        return self._poll(0) is None

    @property
    def exitcode(self) -> int | None:
        """None while running; 0 on success, 1 after an exception, ``SystemExit``'s code, -15/-9 when stopped."""
        return self._poll(0)

    @property
    def pid(self) -> int | None:
        """The OS pid of the worker process running the target (on the worker's host), once started."""
        if self._popen_pid is None and self._future is not None:
            data = self._call("box_get", name=f"{self._key}-pid", timeout=30.0)
            if data is not None:
                self._popen_pid = int(cloudpickle.loads(data)["pid"])
        return self._popen_pid

    ident = pid

    @property
    def name(self) -> str:
        return self._pname

    @name.setter
    def name(self, value: str) -> None:
        if not isinstance(value, str):
            raise TypeError("name must be a string")
        self._pname = value

    @property
    def daemon(self) -> bool:
        return self._daemonic

    @daemon.setter
    def daemon(self, value: bool) -> None:
        if self._future is not None:
            raise AssertionError("process has already started")
        self._daemonic = bool(value)

    @property
    def authkey(self) -> bytes:
        import multiprocessing

        return bytes(multiprocessing.current_process().authkey)

    @property
    def sentinel(self) -> int:
        raise ValueError("a cluster Process has no OS sentinel; use join(timeout) or is_alive()")

    # -- stopping ----------------------------------------------------------------------------
    def terminate(self) -> None:
        """Stop the process now (exit code -15)."""
        self._stop(SIGTERM_EXIT)

    def kill(self) -> None:
        """Stop the process now (exit code -9)."""
        self._stop(SIGKILL_EXIT)

    def _stop(self, code: int) -> None:
        self._check_closed()
        if self._future is None or self._poll(0) is not None:
            return
        from ..engine.cluster import run_on_every_worker
        from ..engine.worker import stop_group

        try:
            run_on_every_worker(self._client, stop_group, self._key)
        except Exception:  # the cluster is gone, and the process with it
            pass
        self._future.cancel()
        self._exitcode = code
        self._end_output(stopped=True)
        with _children_lock:
            _children.discard(self)

    def close(self) -> None:
        """Release the process object; ``ValueError`` if it is still running."""
        if self._closed:
            return
        if self._future is not None and self._poll(0) is None:
            raise ValueError(
                "Cannot close a process while it is still running. You should first call join() or terminate()."
            )
        self._future = None
        self._closed = True

    def __repr__(self) -> str:
        if self._closed:
            status = "closed"
        elif self._future is None:
            status = "initial"
        else:
            code = self._poll(0)
            status = "started" if code is None else f"stopped exitcode={code}"
        daemon = " daemon" if self._daemonic else ""
        return f"<{type(self).__name__} name={self._pname!r} {status}{daemon}>"

    def __hash__(self) -> int:
        return id(self)


def _ignore(future: Any) -> None:
    return None


def _run_process(blob: bytes, key: str) -> tuple[int, str]:
    """The task of a ``Process``: secede, say where it runs, run ``run()`` in its stop group; (exit code, traceback)."""
    from distributed import get_worker, secede

    from ..engine.worker import GroupStopped, run_in_group

    secede()  # hold no thread of the worker's pool: processes run beside maps and each other
    process = cloudpickle.loads(blob)
    process._popen_pid = os.getpid()  # current_process().pid in the target: this worker process
    process._call(
        "box_put", name=f"{key}-pid", data=cloudpickle.dumps({"pid": os.getpid(), "worker": get_worker().address})
    )
    token = _current.set(process)
    try:
        return run_in_group(key, _run_target, process)
    except GroupStopped:
        return SIGTERM_EXIT, ""
    finally:
        _current.reset(token)


def _run_target(process: Process) -> tuple[int, str]:
    from ..engine.worker.run import _STATE, install_thread_streams

    output = getattr(process, "_output", None)
    if output is not None:
        install_thread_streams(_STATE)  # this thread's prints go to output, other threads' stay theirs
        _STATE.local.buf = _LineSender(output)
    stderr = sys.stderr
    try:
        code, text = _exit_of(process)
    finally:
        replaced, sys.stderr = sys.stderr, stderr  # the worker's own stderr stays its logs'
        if output is not None:
            _STATE.local.buf.flush()
            _STATE.local.buf = None
            output.put(_END)
    if text and replaced is not stderr:  # the target redirected its stderr (to a file): the report goes there
        replaced.write(text)
        replaced.flush()
        text = ""
    return code, text


def _exit_of(process: Process) -> tuple[int, str]:
    """``run()``'s exit code and the report multiprocessing would print in the child's stderr."""
    try:
        process.run()
    except SystemExit as exc:
        if exc.code is None:
            return 0, ""
        if isinstance(exc.code, int):
            return exc.code, ""
        return 1, f"{exc.code}\n"
    except BaseException:  # noqa: BLE001 - reported as multiprocessing does: traceback and exit code 1
        return 1, f"Process {process.name}:\n{traceback.format_exc()}"
    return 0, ""


#: Longest a finished process's join() waits for the rest of its printed output, in seconds.
OUTPUT_WAIT_SECONDS = 10.0
#: What ends a process's output channel.
_END = "\0jupyter-cluster-process-end"


class _LineSender:
    """A target's captured stdout/stderr: sent to its output queue a line at a time."""

    def __init__(self, output: ClusterQueue):
        self._output = output
        self._pending: list[str] = []

    def write(self, text: str) -> int:
        self._pending.append(text)
        if "\n" in text:
            self.flush()
        return len(text)

    def flush(self) -> None:
        if self._pending:
            text, self._pending = "".join(self._pending), []
            self._output.put(text)

    def clear(self) -> None:
        self._pending = []

    def getvalue(self) -> str:
        return ""


def _print_output(output: ClusterQueue) -> None:
    """The parent's thread that prints what a process's target prints, until its end marker."""
    import queue as stdqueue

    while True:
        try:
            text = output.get(timeout=5.0)
        except stdqueue.Empty:
            continue
        except Exception:  # the queue or the cluster is gone: the process is over
            return
        if text == _END:
            return
        sys.stdout.write(text)
        sys.stdout.flush()


def current_process() -> Any:
    """The :class:`Process` whose target runs here, or ``multiprocessing.current_process()`` elsewhere."""
    found = _current.get()
    if found is not None:
        return found
    import multiprocessing

    return multiprocessing.current_process()


def active_children() -> list[Process]:
    """The processes started from here that have not ended."""
    with _children_lock:
        children = list(_children)
    return [p for p in children if p.is_alive()]
