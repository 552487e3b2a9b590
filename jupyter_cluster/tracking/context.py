"""Named runs: ``with jc.run(name, config=...)`` and the map function that carries one to the workers.

A :class:`Run` is the context of every map, ``%%spmd`` cell and kernel-side ``report()`` inside its
``with`` block: its id goes with their records (:mod:`.record`), and with the maps' functions
(:class:`RunCall`), so that what the workers report is the run's.
"""

from __future__ import annotations

import contextvars
import os
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from ..telemetry.tags import MAX_CONFIG_KEYS, _active, _call, clean_config
from .kernel import cell_info, cluster_name, current_handle, kernel_id, notebook_path
from .record import keep


class Run:
    """A named run: every map, ``%%spmd`` cell and kernel-side ``report()`` inside its ``with`` block.

    Made by :func:`jupyter_cluster.run`.  Its record is published on the jobs topic like a
    job's (kind ``"run"``), so the panel and ``GET …/api/runs`` list it, and
    the maps started inside carry its id as their ``run``.

    Attributes
    ----------
    id, name : str
    config : dict
        The hyperparameters given, plus those ``report(config=...)`` added in the kernel.
    state : str
        ``"running"``, then ``"finished"``, ``"failed"`` or ``"cancelled"``.
    """

    def __init__(self, name: str, config: Mapping[str, Any] | None = None):
        if not isinstance(name, str) or not name.strip() or len(name) > 200:
            raise TypeError(f"run() needs a name of 1 to 200 characters, such as 'baseline', not {name!r:.40}.")
        self.id = uuid.uuid4().hex[:12]
        self.name = name.strip()
        self.config = clean_config(config, "run(config=...)")
        self.state = "running"
        self.started = time.time()
        self.ended: float | None = None
        self.jobs: list[str] = []
        #: what :meth:`set` gave: carried in the context of the jobs started after it
        self.context: dict[str, Any] = {}
        self.notebook = notebook_path()
        self.cell = cell_info()
        self._token: contextvars.Token | None = None

    def __repr__(self) -> str:
        return f"<Run {self.name!r} {self.state}: {self.config}>"

    def __enter__(self) -> Run:
        self._token = _active.set(self)
        self.publish()
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        self.ended = time.time()
        if kind is None:
            self.state = "finished"
        elif issubclass(kind, KeyboardInterrupt):
            self.state = "cancelled"
        else:
            self.state = "failed"
        if self._token is not None:
            _active.reset(self._token)
            self._token = None
        self.publish()

    def set(self, **context: Any) -> None:
        """Context the run's next jobs carry (``run.set(generation=g)``: the panel shows it with each job).

        Raises
        ------
        TypeError
            For more than 16 fields.
        """
        if len(self.context) + len(context) > 16:
            raise TypeError("run.set() keeps at most 16 context fields.")
        self.context.update(clean_config(context, "run.set()"))

    def add_config(self, config: Mapping[str, Any]) -> None:
        """Add hyperparameters (``report(config=...)`` in the kernel calls it)."""
        self.config.update(clean_config(config))
        if len(self.config) > MAX_CONFIG_KEYS:
            raise TypeError(
                f"a run keeps at most {MAX_CONFIG_KEYS} config entries; {self.name!r} has {len(self.config)}."
            )

    def message(self) -> dict[str, Any]:
        """The run's record as the jobs topic carries it."""
        from ..wire.models import job_message

        msg: dict[str, Any] = dict(
            job_message(
                job=self.id,
                label=self.name,
                kernel=os.getpid(),
                cluster=cluster_name(),
                total=None,
                done=0,
                failed=0,
                state=self.state,
                started=self.started,
                updated=time.time(),
                kernel_id=kernel_id(),
            )
        )
        msg.update(
            run=self.id,
            kind="run",
            name=self.name,
            notebook=self.notebook,
            cell=self.cell,
            config=dict(self.config),
            context=dict(self.context, jobs=len(self.jobs)),
        )
        if self.ended is not None:
            msg["ended"] = self.ended
        return msg

    def publish(self) -> None:
        """Keep the record here (:func:`jupyter_cluster.runs`) and send it on the jobs topic (when a cluster is connected)."""
        msg = self.message()
        keep(msg)
        try:
            from ..telemetry.producer import publish
            from ..telemetry.topic_names import JOBS_TOPIC

            h = current_handle()
            if h is not None:
                publish(h.client, JOBS_TOPIC, msg)
        except Exception:  # no cluster, or one going away: the kernel keeps the record all the same
            pass


class RunCall:
    """A map's function as sent from inside ``with jc.run(...)``: on the worker, its reports are the run's.

    The named run lives in the notebook (a context variable); a task on a
    worker knows it only from what travels with the function.  Calling this
    marks the worker thread as running the run's work until ``func`` returns,
    so ``report()`` below it (any depth) is tagged with the run
    (:func:`~jupyter_cluster.telemetry.tags.tag_record`).

    Attributes
    ----------
    func : callable
        What the user mapped (a ``functools.partial``'s own ``func``), for the
        job's name; the call goes to the callable given.
    run : str
        The run's id.
    """

    __slots__ = ("_fn", "func", "run")

    def __init__(self, fn: Any, run: str):
        self._fn = fn
        self.func = getattr(fn, "func", fn)
        self.run = run

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        outer = getattr(_call, "run", None)
        _call.run = self.run
        try:
            return self._fn(*args, **kwargs)
        finally:
            _call.run = outer

    # What the worker asks of a map's function besides calling it (engine/worker/run.py) goes
    # through to the function wrapped: a Pool's task inside the run must still be stopped by
    # terminate() and still send back MaybeEncodingError for a result pickle cannot send.
    @property
    def stop_group(self) -> str | None:
        """The wrapped function's ``stop_group`` (a ``Pool``'s task: its pool's id), or None."""
        return getattr(self._fn, "stop_group", None)

    @property
    def check_result(self) -> Callable[[Any], BaseException | None] | None:
        """The wrapped function's ``check_result`` (a ``Pool``'s task: multiprocessing's error for a result), or None."""
        return getattr(self._fn, "check_result", None)

    def __repr__(self) -> str:
        return f"<RunCall {self.func!r} of run {self.run}>"


def in_run(fn: Any) -> Any:
    """``fn`` as a map sends it: inside ``with jc.run(...)``, a :class:`RunCall` of the run; else ``fn`` itself.

    A ``%%parallel`` cell (anything with a ``cell_text``) is left as it is: its
    items are tagged by its :class:`.tags.ItemTag`, which names the same run.
    """
    named = _active.get()
    if named is None or isinstance(fn, RunCall) or hasattr(fn, "cell_text"):
        return fn
    return RunCall(fn, named.id)


def active_run() -> Run | None:
    """The innermost :func:`jupyter_cluster.run` block this code is in, or None."""
    return _active.get()
