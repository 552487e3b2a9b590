"""The pool: the ``multiprocessing.Pool`` API on the current cluster.

The pool owns no processes.  ``apply``/``apply_async`` are single Dask tasks;
``map``/``imap``/``starmap`` and their async forms are front ends to the one map
engine (:mod:`jupyter_cluster.engine`), which brings chunking, backpressure
and survival of lost workers.  What is left here is ``multiprocessing``'s
contract: the states (running, closed, terminated) and their errors, result
objects, callbacks run from a result thread in this process, ``processes`` as
a cap on concurrency, and the per-process ``initializer``.

Deliberate differences from ``multiprocessing.Pool`` are listed in docs/pool.md
("Deliberate differences from multiprocessing.Pool").
"""

from __future__ import annotations

import collections
import functools
import queue
import sys
import threading
import traceback
import uuid
import warnings
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import cloudpickle

from .._core.context import in_kernel
from ..cluster import session
from ..engine.cluster import (
    cancel_futures,
    client_running,
    finished_values,
    run_on_every_worker,
    submit_call,
    task_key,
)
from ..engine.scheduler_watch import SchedulerWatch, scheduler_lost_error, translate_error
from ..engine.worker import stop_group
from ..mapping import MapJob, imap  # the one front door of every map (MapJob: its type only)
from .results import (
    _PLAIN_INPUTS,
    CLOSE,
    INIT,
    RUN,
    TERMINATE,
    ApplyResult,
    IMapIterator,
    IMapUnorderedIterator,
    MapResult,
    _guarded,
    _Iter,
    _raise_first_failure,
)
from .worker import _apply, _apply_chunk, _Failed, _forget_pool, _PoolTask

#: Longest ``terminate()`` waits for the workers to confirm that the pool's running work stopped, in
#: seconds (``join()`` waits for the rest); a sick cluster must not make it hang.
STOP_WAIT_SECONDS = 10.0


# -- the pool ------------------------------------------------------------------------------


def _check_chunksize(chunksize: Any) -> Any:
    """multiprocessing's chunksize rules, plus ``None``/``"auto"`` meaning the engine's auto-chunking."""
    if chunksize is None or chunksize == "auto":
        return "auto"
    if isinstance(chunksize, bool) or not isinstance(chunksize, int):
        raise TypeError(f"chunksize must be an int, None or 'auto', not {type(chunksize).__name__}")
    if chunksize < 1:
        raise ValueError(f"Chunksize must be 1+, not {chunksize:n}")
    return chunksize


def _funcname(func: Any) -> str:
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or type(func).__name__


class Pool:
    """A ``multiprocessing.Pool`` whose workers are the current cluster's.

    Same constructor, methods, return types and exceptions as
    :class:`multiprocessing.pool.Pool`; functions defined in the notebook and
    lambdas work (they are pickled with cloudpickle).  Resilient by default:
    if a worker process dies during a map, its items run again elsewhere and
    every result still arrives exactly once (so an item may *run* more than
    once: keep side effects idempotent).

    Parameters
    ----------
    processes : int, optional
        The most tasks of this pool that run at once.  ``None`` (default):
        every worker thread of the cluster.
    initializer : callable, optional
        Called as ``initializer(*initargs)`` once in each worker process the
        pool uses, before that process runs the pool's first task there.
    initargs : tuple
        Arguments for ``initializer``.
    maxtasksperchild : int, optional
        Accepted and checked, but worker processes are shared by the whole
        cluster and are not recycled after a number of tasks; see docs/pool.md.
    context : object, optional
        Accepted for compatibility and ignored (there is no start method to choose).
    cluster : str or ClusterHandle, optional
        Keyword only.  Which cluster held by this process to use; by default
        the current one, and with none, the default local cluster is started.
    progress : bool, optional
        Keyword only.  Progress display for maps, as in
        :func:`jupyter_cluster.map`.  ``None`` (default): automatic in a
        Jupyter kernel (shown once a map lasts a second), none in a script.

    Examples
    --------
    >>> import jupyter_cluster as jc
    >>> with jc.Pool() as pool:                       # doctest: +SKIP
    ...     pool.map(lambda x: x * x, range(5))
    [0, 1, 4, 9, 16]
    """

    def __init__(
        self,
        processes: int | None = None,
        initializer: Callable | None = None,
        initargs: Iterable = (),
        maxtasksperchild: int | None = None,
        context: Any = None,
        *,
        cluster: Any = None,
        progress: bool | None = None,
    ):
        self._state = INIT  # set first so that a failing __init__ leaves a sane object (and __del__ no warning)
        if processes is not None:
            if isinstance(processes, bool) or not isinstance(processes, int):
                raise TypeError(f"processes must be an int or None, not {type(processes).__name__}")
            if processes < 1:
                raise ValueError("Number of processes must be at least 1")
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be a callable")
        if maxtasksperchild is not None and (
            isinstance(maxtasksperchild, bool) or not isinstance(maxtasksperchild, int) or maxtasksperchild <= 0
        ):
            raise ValueError("maxtasksperchild must be a positive int or None")

        handle = session.resolve(cluster)
        self._handle = handle
        self._client = handle.client
        self._limit = processes
        threads = max(handle.nthreads, 1)
        self._processes = processes if processes is not None else threads
        # Asked for more processes than the cluster has threads: each call leaves Dask's thread
        # count as it starts (secede), so N calls run at once -- calls that wait on each other or on
        # this process (a Queue) would otherwise deadlock with no message.
        self._wide = processes is not None and processes > threads
        self._initializer = initializer
        self._initargs = tuple(initargs)
        self._maxtasksperchild = maxtasksperchild
        # Automatic progress in a Jupyter kernel; a script gets none, as with multiprocessing.
        self._progress = False if progress is None and not in_kernel() else progress
        self._id = f"pool-{uuid.uuid4().hex[:12]}"

        self._lock = threading.RLock()
        self._idle = threading.Condition(self._lock)
        self._cache: set[ApplyResult] = set()
        self._pending: collections.deque = collections.deque()  # applies waiting for a slot
        self._running: dict[str, tuple[Any, ApplyResult]] = {}  # key -> (future, result)
        self._iterators: weakref.WeakSet[IMapIterator] = weakref.WeakSet()
        self._map_jobs: set[Any] = set()
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._scheduler_watch = SchedulerWatch(self._client)
        self._forgotten = False
        self._used = False  # whether any work was sent (terminate() then stops it on the workers)
        self._stopper: threading.Thread | None = None
        self._result_thread = threading.Thread(
            target=_handle_results,
            args=(self._outbox, weakref.WeakMethod(self._watch_connection)),
            daemon=True,
            name=f"jupyter-cluster-{self._id}-results",
        )
        self._result_thread.start()
        self._state = RUN

    def __del__(self) -> None:
        # As multiprocessing: a pool dropped while running is a leak of what it holds.
        if getattr(self, "_state", None) == RUN:
            try:
                name = repr(self)
            except Exception:
                name = "<jupyter_cluster.Pool>"
            warnings.warn(f"unclosed running multiprocessing pool {name}", ResourceWarning, source=self, stacklevel=1)

    # -- state ---------------------------------------------------------------
    def _check_running(self) -> None:
        if self._state != RUN:
            raise ValueError("Pool not running")

    def __repr__(self) -> str:
        return f"<jupyter_cluster.Pool state={self._state} processes={self._processes} cluster={self._handle.name!r}>"

    def __reduce__(self):
        raise NotImplementedError("pool objects cannot be passed between processes or pickled")

    def __enter__(self) -> Pool:
        self._check_running()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.terminate()

    def _cache_add(self, result: ApplyResult) -> None:
        with self._lock:
            self._cache.add(result)

    def _cache_remove(self, result: ApplyResult) -> None:
        with self._lock:
            self._cache.discard(result)
            if not self._cache:
                self._idle.notify_all()

    def _task(self, func: Callable, star: bool = False) -> _PoolTask:
        self._used = True
        return _PoolTask(func, self._id, self._initializer, self._initargs, star)

    # -- apply ----------------------------------------------------------------
    def apply(self, func: Callable, args: tuple = (), kwds: dict = {}) -> Any:  # noqa: B006 (multiprocessing's signature)
        """Call ``func(*args, **kwds)`` on a worker and return its result."""
        return self.apply_async(func, args, kwds).get()

    def apply_async(
        self,
        func: Callable,
        args: tuple = (),
        kwds: dict = {},  # noqa: B006 (multiprocessing's signature)
        callback: Callable | None = None,
        error_callback: Callable | None = None,
    ) -> ApplyResult:
        """Start ``func(*args, **kwds)`` on a worker; returns an :class:`AsyncResult`.

        ``callback(result)`` or ``error_callback(exception)`` is called in this
        process, from the pool's result thread, when the call completes.
        """
        self._check_running()
        result = ApplyResult(self, callback, error_callback)
        call = (result, self._task(func), tuple(args), dict(kwds), _funcname(func))
        with self._lock:
            if self._limit is None or len(self._running) < self._limit:
                self._submit(*call)
            else:
                self._pending.append(call)
        return result

    def _submit(self, result: ApplyResult, task: _PoolTask, args: tuple, kwds: dict, name: str) -> None:
        # called with self._lock held
        key = f"{name.replace('<', '').replace('>', '')}-{uuid.uuid4().hex}"
        try:
            # _on_done may start before the future is recorded below; it waits for self._lock.
            on_done = functools.partial(self._on_done, name=name)
            if kwds.get("\0chunk"):  # a chunk of a wide pool's map (_map_wide)
                future = submit_call(self._client, _apply_chunk, task, args[0], True, key=key, on_done=on_done)
            else:
                future = submit_call(self._client, _apply, task, args, kwds, self._wide, key=key, on_done=on_done)
        except Exception as exc:  # e.g. an argument that cannot be pickled
            error: BaseException = exc
            if not client_running(self._client):  # Dask's "client is closed": say what happened to the cluster
                error = scheduler_lost_error(self._client, "this call was not sent", "a new Pool", self._handle.name)
            self._outbox.put((result._set, False, error))
            return
        self._running[key] = (future, result)

    def _on_done(self, future: Any, name: str) -> None:
        # Runs on Dask's callback thread: hand the result to our own result
        # thread (where user callbacks run), then fill the freed slot.
        with self._lock:
            entry = self._running.pop(task_key(future), None)
            if entry is None or self._state == TERMINATE:
                return
            self._outbox.put((self._finish_applies, [(future, entry[1], name)]))
            while self._pending and (self._limit is None or len(self._running) < self._limit):
                self._submit(*self._pending.popleft())

    def _finish_applies(self, batch: list[tuple[Any, ApplyResult, str]]) -> None:
        """Fill finished applies' results in completion order (their values fetched in one gather)."""
        if self._state == TERMINATE:
            return
        outcomes = finished_values(self._client, [future for future, _, _ in batch])
        # outcomes first: zip then resumes it after the last result, which releases that future too.
        for (ok, value), (_, result, name) in zip(outcomes, batch):
            if ok and type(value) is _Failed:
                result._set(False, value.error())
            elif ok:
                result._set(True, value)
            else:
                result._set(False, self._translate(value, name))

    def _watch_connection(self) -> None:
        """Fail outstanding applies soon after the scheduler goes away.

        Dask's futures would stay pending while the client tries to
        reconnect; the map engine gives up after the same grace period.
        """
        with self._lock:
            if not self._running and not self._pending:
                self._scheduler_watch.reset()
                return
        if not self._scheduler_watch.lost():
            return
        with self._lock:
            lost = [result for _, result in self._running.values()] + [call[0] for call in self._pending]
            self._running.clear()
            self._pending.clear()
        for result in lost:
            result._set(
                False,
                scheduler_lost_error(
                    self._client, "this call's result is lost", "a new Pool", cluster=self._handle.name
                ),
            )

    def _translate(self, exc: BaseException, name: str) -> BaseException:
        """Dask's ways of saying "the cluster failed" in our words (shared with the map engine)."""
        return translate_error(exc, f"apply_async({name})", self._handle.name)

    # -- map family ----------------------------------------------------------
    def _job(self, task: _PoolTask, iterable: Iterable, chunksize: Any, label: str, **options: Any) -> MapJob:
        """A map job of the engine for this pool (not started: jobs advance as they are iterated)."""
        chunk = _check_chunksize(chunksize)
        return imap(
            task,
            iterable,
            chunksize=chunk,
            concurrency=self._limit,
            client=self._client,
            label=label,
            progress=self._progress,
            on_output=_print_output,
            **options,
        )

    def map(self, func: Callable, iterable: Iterable, chunksize: int | None = None) -> list:
        """``list(map(func, iterable))`` on the cluster, in input order.

        ``chunksize`` groups items into tasks as in multiprocessing; ``None``
        lets the engine choose.  A failing item re-raises its exception (same
        type) with a note naming the item.
        """
        self._check_running()
        return self._map(self._task(func), iterable, chunksize, f"Pool.map({_funcname(func)})")

    def starmap(self, func: Callable, iterable: Iterable, chunksize: int | None = None) -> list:
        """Like :meth:`map`, but each item is a tuple of arguments: ``func(*item)``."""
        self._check_running()
        return self._map(self._task(func, star=True), iterable, chunksize, f"Pool.starmap({_funcname(func)})")

    def _map(self, task: _PoolTask, iterable: Iterable, chunksize: Any, label: str) -> list:
        if self._wide:
            return self._map_wide(task, iterable, chunksize, None, None).get()
        # errors="collect": a failed item does not stop the others (multiprocessing's map runs them
        # all, then raises the failure); _raise_first_failure raises it once they have run.
        job = self._job(task, iterable, chunksize, label, ordered=True, errors="collect", retain=True)
        with self._lock:
            self._map_jobs.add(job)
        try:
            job.run()
        finally:
            with self._lock:
                self._map_jobs.discard(job)
        if self._state == TERMINATE:
            raise ValueError("Pool not running")
        _raise_first_failure(job)
        return job.result_list()

    def map_async(
        self,
        func: Callable,
        iterable: Iterable,
        chunksize: int | None = None,
        callback: Callable | None = None,
        error_callback: Callable | None = None,
    ) -> MapResult:
        """Start :meth:`map`; returns a :class:`MapResult` whose ``get()`` is the list."""
        return self._map_async(func, iterable, chunksize, callback, error_callback, "map_async")

    def starmap_async(
        self,
        func: Callable,
        iterable: Iterable,
        chunksize: int | None = None,
        callback: Callable | None = None,
        error_callback: Callable | None = None,
    ) -> MapResult:
        """Start :meth:`starmap`; returns a :class:`MapResult`."""
        return self._map_async(func, iterable, chunksize, callback, error_callback, "starmap_async")

    def _map_async(
        self, func: Callable, iterable: Iterable, chunksize: Any, callback: Any, error_callback: Any, method: str
    ) -> MapResult:
        self._check_running()
        task = self._task(func, star=method == "starmap_async")
        if self._wide:
            return self._map_wide(task, iterable, chunksize, callback, error_callback)
        if not hasattr(iterable, "__len__"):
            iterable = list(iterable)  # as multiprocessing: a failing generator raises here, in the caller
        label = f"Pool.{method}({_funcname(func)})"
        job = self._job(task, iterable, chunksize, label, ordered=True, errors="collect", retain=True)
        result = MapResult(self, callback, error_callback)
        with self._lock:
            self._map_jobs.add(job)

        def run() -> None:
            # This thread is the call's result thread: callbacks run here.
            try:
                job.run()
                _raise_first_failure(job)
                values = job.result_list()
            except BaseException as exc:
                if self._state != TERMINATE:
                    result._set(False, exc)
            else:
                if self._state != TERMINATE:
                    result._set(True, values)
            finally:
                with self._lock:
                    self._map_jobs.discard(job)

        threading.Thread(target=run, daemon=True, name=f"jupyter-cluster-{self._id}-map").start()
        return result

    def _map_wide(
        self, task: _PoolTask, iterable: Iterable, chunksize: Any, callback: Any, error_callback: Any
    ) -> MapResult:
        """A map of a pool wider than the cluster: its chunks are seceding calls, N at once (see ``_wide``)."""
        size = _check_chunksize(chunksize)
        items = list(iterable)
        if not isinstance(size, int):  # multiprocessing's default: four chunks per process
            size = max(1, -(-len(items) // (4 * self._processes)))
        result = MapResult(self, callback, error_callback)
        try:
            # Pickled here: an item that cannot be pickled raises its own error before anything runs, and
            # Dask's messages hold bytes, not the items (CPython's test_release_task_refs).
            blobs = [cloudpickle.dumps(items[start : start + size]) for start in range(0, len(items), size)]
        except Exception as exc:
            result._set(False, exc)
            return result
        del items
        parts = []
        for blob in blobs:
            part = ApplyResult(self, None, None)
            call = (part, task, (blob,), {"\0chunk": True}, _funcname(task.func))
            with self._lock:
                if len(self._running) < self._processes:
                    self._submit(*call)
                else:
                    self._pending.append(call)
            parts.append(part)

        def collect() -> None:
            values: list = []
            try:
                for part in parts:
                    values.extend(part.get())
                failed = next((v for v in values if type(v) is _Failed), None)
            except BaseException as exc:
                if self._state != TERMINATE:
                    result._set(False, exc)
                return
            finally:
                parts.clear()  # the chunks' results are the map's list's now
            if self._state == TERMINATE:
                return
            if failed is not None:
                result._set(False, failed.error())
            else:
                result._set(True, values)

        threading.Thread(target=collect, daemon=True, name=f"jupyter-cluster-{self._id}-map").start()
        return result

    def imap(self, func: Callable, iterable: Iterable, chunksize: int = 1) -> IMapIterator:
        """A lazy ``map``: an iterator of results in input order.

        The input is consumed as results are taken, with a bounded number of
        items in flight, so ``iterable`` may be long or infinite.
        """
        self._check_running()
        return self._imap(func, iterable, chunksize, IMapIterator, "imap")

    def imap_unordered(self, func: Callable, iterable: Iterable, chunksize: int = 1) -> IMapUnorderedIterator:
        """Like :meth:`imap`, but results come in completion order."""
        self._check_running()
        return self._imap(func, iterable, chunksize, IMapUnorderedIterator, "imap_unordered")

    def _imap(self, func: Callable, iterable: Iterable, chunksize: Any, cls: type[_Iter], method: str) -> _Iter:
        # errors="collect": a failed item raises at its place and iteration
        # can go on past it, as with multiprocessing's iterators.
        failed: list = []
        if not isinstance(iterable, _PLAIN_INPUTS):
            size = _check_chunksize(chunksize)
            iterable = _guarded(iterable, size if isinstance(size, int) else 1, failed)
        job = self._job(
            self._task(func),
            iterable,
            chunksize,
            f"Pool.{method}({_funcname(func)})",
            ordered=cls._ordered,
            errors="collect",
            retain=False,
        )
        it = cls(self, job, failed)
        self._iterators.add(it)
        return it

    # -- lifecycle ------------------------------------------------------------
    def close(self) -> None:
        """Accept no more work; what was submitted still runs."""
        with self._lock:
            if self._state == RUN:
                self._state = CLOSE

    def terminate(self) -> None:
        """Stop now: cancel queued and running work.  Results not yet ready stay unready."""
        with self._lock:
            if self._state == TERMINATE:
                return
            self._state = TERMINATE
            self._pending.clear()
            futures = [f for f, _ in self._running.values()]
            self._running.clear()
            jobs = list(self._map_jobs)
            iterators = list(self._iterators)
            self._idle.notify_all()
        if futures:
            cancel_futures(self._client, futures, reason="Pool.terminate()")
        for job in jobs:
            try:
                job.cancel()
            except Exception:
                pass
        for it in iterators:
            it._cancel()
        self._outbox.put(None)
        self._stop_on_workers()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the submitted work to finish; call :meth:`close` or :meth:`terminate` first.

        ``timeout`` (not in multiprocessing) bounds the wait, in seconds.
        """
        with self._lock:
            if self._state == RUN:
                raise ValueError("Pool is still running")
            if self._state == CLOSE:
                self._idle.wait_for(lambda: not self._cache or self._state == TERMINATE, timeout)
        if self._state == CLOSE and not self._cache:
            self._outbox.put(None)
            self._forget_on_workers()
        if threading.current_thread() is not self._result_thread:
            self._result_thread.join(timeout)
        stopper = self._stopper
        if stopper is not None and stopper is not threading.current_thread():
            stopper.join(timeout)

    def _stop_on_workers(self) -> None:
        """Stop the pool's running items on every worker, and release its globals there.

        Dask cannot stop a running task; each worker runs the pool's items in
        a helper thread (:func:`~jupyter_cluster.engine.worker.run_in_group`)
        and, told here, gives the task's thread back at once, as
        ``multiprocessing`` ends its processes.  Waits up to
        :data:`STOP_WAIT_SECONDS` for the workers' answer; ``join()`` waits for the rest.
        """
        if not self._used:
            self._forget_on_workers()
            return
        forget = self._initializer is not None and not self._forgotten
        self._forgotten = True
        client, pool_id = self._client, self._id

        def stop() -> None:
            try:
                run_on_every_worker(client, stop_group, pool_id)
                if forget:
                    run_on_every_worker(client, _forget_pool, pool_id)
            except Exception:  # the cluster is gone, and the work with it
                pass

        stopper = self._stopper = threading.Thread(target=stop, daemon=True, name=f"jupyter-cluster-{pool_id}-stop")
        stopper.start()
        stopper.join(STOP_WAIT_SECONDS)

    def _forget_on_workers(self) -> None:
        """Drop what the initializer left in the workers' pool namespaces.

        multiprocessing ends its processes here, freeing whatever the
        initializer loaded; cluster workers live on, so the pool's globals
        are released instead (in the background: never block on a sick cluster).
        This is the pool's only run-on-every-worker step (its initializer runs
        lazily, in the first task a worker process gets), and it goes through
        :func:`~jupyter_cluster.engine.cluster.run_on_every_worker`, not
        :func:`~jupyter_cluster.mapping.all_workers_job`, because it must not
        wait for a free thread on workers busy with other work nor show a job
        in progress bars or the panel.
        """
        if self._initializer is None or self._forgotten:
            return
        self._forgotten = True
        client, pool_id = self._client, self._id

        def forget() -> None:
            try:
                run_on_every_worker(client, _forget_pool, pool_id)
            except Exception:  # the cluster is gone, and the state with it
                pass

        threading.Thread(target=forget, daemon=True, name=f"jupyter-cluster-{pool_id}-forget").start()


def _print_output(index: int, text: str, failed: bool) -> None:
    """Show what a task printed, here, as it arrives (multiprocessing's workers share our stdout)."""
    sys.stdout.write(text)


_NOTHING = object()


def _handle_results(outbox: queue.SimpleQueue, watch: weakref.WeakMethod) -> None:
    """The pool's result thread: finishes results and runs user callbacks, in order.

    Between results it checks the connection to the scheduler (``watch``).
    """
    while True:
        try:
            entry = outbox.get(timeout=0.5)
        except queue.Empty:
            check = watch()
            if check is None:  # the pool is gone
                return
            check()
            del check
            continue
        while True:
            if entry is None:
                return
            fn, *args = entry
            entry = _NOTHING
            if getattr(fn, "__func__", None) is Pool._finish_applies:
                # Take every apply that is done already into one batch.
                while True:
                    try:
                        following = outbox.get_nowait()
                    except queue.Empty:
                        break
                    if following is not None and following[0] == fn:
                        args[0].extend(following[1])
                        del following  # it holds the batch's results too (CPython's test_release_task_refs)
                        continue
                    entry = following
                    del following
                    break
            try:
                fn(*args)
            except Exception:  # keep serving the other results
                traceback.print_exc()
            del fn, args
            if entry is _NOTHING:
                break
