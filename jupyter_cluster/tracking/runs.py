"""Runs: one map, ``%%spmd`` cell or :func:`run` block, with its notebook, cell and hyperparameters.

A *run* is what a researcher compares: the jobs of one cell (or of one named
``with jc.run(name, config=...)`` block), the notebook and cell that started
them, when, for how long, how it ended, and the hyperparameters it was given.
For ``%%parallel cfg in grid`` each *item* is a row of the sweep table: its
config is the item's value (a dict, or the named targets of
``%%parallel lr, mom in grid``), to which ``report(..., config=...)`` adds.

How the pieces meet::

    kernel: the map's job message (jobs topic) carries run, kind, notebook, cell, config
            and, at its end, the items' configs, states and durations  (:func:`job_context`,
            :func:`job_items`)
    task:   report() inside a %%parallel item tags each record with the run and the item's
            key (:func:`current_item`, set by the worker around each item's cell),
            so every TopicStore keeps the item's final/best
            values (:meth:`jupyter_cluster.telemetry.topic_store.TopicStore.run_items`)
    table:  :func:`table` joins the two: one row per item (or per run), config columns,
            then ``<metric>`` (final) and ``<metric>.best`` columns.  The kernel's
            :func:`runs` and the server's ``GET …/api/runs/<id>`` build it alike.

An item is known on the workers by its *key* (its config as ``"lr=0.1, mom=0.9"``),
not by its index, which the engine does not hand to the cell: two items of one
run with equal configs share their metrics.
"""

from __future__ import annotations

import contextvars
import hashlib
import itertools
import os
import sys
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

# The tag state and config cleaning live in a leaf, which the report producer reads without importing
# runs; they are re-exported here, where the rest of the package and users have always found them.
from ..state.history_files import checked_run_items, kept_run_items
from ..telemetry.tags import (
    MAX_CONFIG_KEYS,
    MAX_VALUE_TEXT,  # noqa: F401  (re-exported)
    TAG_NAME,  # noqa: F401  (re-exported)
    _active,
    _call,
    _clip,
    clean_config,
    config_value,
    current_item,  # noqa: F401  (re-exported)
    tag_record,  # noqa: F401  (re-exported)
)

#: item configs (and states) a run keeps and publishes, and about how many bytes of them; the rest
#: of a long map is counted only
MAX_ITEMS = 2000
MAX_ITEMS_BYTES = 512_000
#: characters of a cell's first line in a run's record
MAX_LINE = 160
#: job messages a kernel keeps for :func:`runs` (oldest dropped first), and sweep items listed in them
KEEP_RUNS = 500
KEEP_ITEMS = 50_000

RUN_KINDS = ("map", "spmd", "run")


# -- where the kernel is -------------------------------------------------------------
def notebook_path() -> str | None:
    """The notebook this kernel runs (its path as the Jupyter server gave it), or None.

    A Jupyter server starts a session's kernel with ``JPY_SESSION_NAME`` set to
    the session's path, which ipykernel also puts in the namespace as
    ``__session__``; a kernel started otherwise (a script, nbclient) has neither.
    Since jupyter_server 2 that is the notebook's full filesystem path (the
    kernel's working directory joined with the notebook's name), not its path
    under the server's root; only a session started without a name gets the
    latter.
    """
    path = os.environ.get("JPY_SESSION_NAME")
    if not path:
        main = sys.modules.get("__main__")
        ip = _shell()
        ns = getattr(ip, "user_ns", None) or getattr(main, "__dict__", {})
        path = ns.get("__session__") if isinstance(ns, dict) else None
    return _clip(path, 1000) if isinstance(path, str) and path else None


def _shell() -> Any:
    if "IPython" not in sys.modules:  # a plain script or a worker: no shell, and no import cost
        return None
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython is a dependency
        return None
    return get_ipython()


def cell_info() -> dict[str, Any] | None:
    """The cell being run: ``{"execution_count", "cell_id", "first_line"}``, or None outside IPython.

    IPython keeps the running cell's text and the id the front end gave it on
    the result it is filling (``displayhook.exec_result.info``).
    """
    ip = _shell()
    if ip is None:
        return None
    result = getattr(getattr(ip, "displayhook", None), "exec_result", None)
    info = getattr(result, "info", None)
    raw = getattr(info, "raw_cell", None)
    count = getattr(result, "execution_count", None)
    cell_id = getattr(info, "cell_id", None)
    first = next((line.strip() for line in str(raw or "").splitlines() if line.strip()), "")
    return {
        "execution_count": count if isinstance(count, int) and not isinstance(count, bool) else None,
        "cell_id": _clip(cell_id, 128) if isinstance(cell_id, str) and cell_id else None,
        "first_line": _clip(first, MAX_LINE),
    }


def target_names(targets: str | None) -> list[Any] | None:
    """The structure of ``%%parallel`` targets: ``"lr, mom"`` -> ``["lr", "mom"]``, ``"cfg"`` -> ``"cfg"``.

    Nested tuples give nested lists; a starred or other target gives None (the item is then one value).
    """
    if not targets:
        return None
    import ast

    try:
        node = ast.parse(f"{targets} = None").body[0]
    except SyntaxError:
        return None
    if not isinstance(node, ast.Assign):
        return None

    def walk(t: ast.AST) -> Any:
        if isinstance(t, ast.Name):
            return t.id
        if isinstance(t, (ast.Tuple, ast.List)):
            parts = [walk(e) for e in t.elts]
            return None if any(p is None for p in parts) else parts
        return None

    return walk(node.targets[0])


def item_config(structure: Any, item: Any) -> dict[str, Any]:
    """The config of one ``%%parallel`` item: a dict item's entries, or the targets it binds.

    ``%%parallel cfg in grid`` with ``cfg = {"lr": .1}`` gives ``{"lr": .1}``;
    ``%%parallel lr, mom in grid`` with ``(0.1, 0.9)`` gives ``{"lr": 0.1, "mom": 0.9}``;
    ``%%parallel seed in range(9)`` with ``3`` gives ``{"seed": 3}``.
    """
    out: dict[str, Any] = {}

    def bind(s: Any, v: Any) -> None:
        if len(out) >= MAX_CONFIG_KEYS:
            return
        if isinstance(s, str):
            if isinstance(v, Mapping) and structure == s:  # the whole item is one dict: its entries
                for k, x in list(v.items())[:MAX_CONFIG_KEYS]:
                    out[str(k)] = config_value(x)
            else:
                out[s] = config_value(v)
        elif isinstance(s, list):
            try:
                values = list(v)
            except TypeError:
                values = []
            if len(values) != len(s):
                out[_clip(str(s), 60)] = config_value(v)
                return
            for sub, x in zip(s, values):
                bind(sub, x)

    if structure is None:
        out["item"] = config_value(item)
    else:
        bind(structure, item)
    return out


def config_key(config: Mapping[str, Any]) -> str:
    """The key an item is known by: ``"lr=0.1, mom=0.9"`` (sorted), a hash past 200 characters."""
    text = ", ".join(f"{k}={config[k]}" for k in sorted(config)) or "-"
    if len(text) > 200:
        text = text[:180] + "…#" + hashlib.sha1(text.encode("utf-8", "replace")).hexdigest()[:12]
    return text


# -- the tag a %%parallel cell's items carry to the workers --------------------------------


class ItemTag:
    """A run's id and its targets' structure, sent with a ``%%parallel`` cell as ``__jc_run__``.

    The worker runs each item's cell with
    :data:`~jupyter_cluster.telemetry.tags.item_state` set, so ``report()`` anywhere
    below the cell (any depth, any module) says which run and item a value
    belongs to (:func:`current_item`, which asks :meth:`describe`).
    """

    def __init__(self, run: str, targets: str | None, sweep: bool = True):
        named = _active.get()
        #: a sweep tags each report with its item; a plain map (:mod:`.sweep_kind`) with its run alone
        self.sweep = sweep
        #: inside ``with jc.run(...)`` the sweep's items are that run's items (its id, not ``run``)
        self.run = named.id if named is not None else run
        self.structure = target_names(targets)
        self.cached: tuple[Any, str, dict[str, Any]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"run": self.run, "structure": self.structure, "sweep": self.sweep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.run = state["run"]
        self.structure = state["structure"]
        self.sweep = state.get("sweep", True)
        self.cached = None

    def describe(self, item: Any) -> tuple[str, dict[str, Any]]:
        """``(key, config)`` of ``item`` (cached for the item last asked about)."""
        last = self.cached
        if last is not None and last[0] is item:
            return last[1], last[2]
        key, config = self.key_and_config(item)
        self.cached = (item, key, config)
        return key, config

    def key_and_config(self, item: Any) -> tuple[str, dict[str, Any]]:
        """``(key, config)`` of ``item``, worked out afresh (a worker keeps it per item: :func:`current_item`).

        A plain map's items are all its run's: ``("", {})``.
        """
        if not self.sweep:
            return "", {}
        config = item_config(self.structure, item)
        return config_key(config), config


#: sources whose items can be read again by index once the map ended (what :class:`ItemTap` notes then)
_INDEXABLE = (list, tuple, range)


class ItemTap:
    """An iterable's items as they are read, their configs noted (the first :data:`MAX_ITEMS`).

    Wraps the ``%%parallel`` iterable without changing what the engine sees:
    the same items, and the same ``len()`` where the iterable has one.  A list,
    tuple or range is handed to the engine as it is and its first items are
    described when the map ends (:meth:`noted`), off the map's way: describing
    them as they were read kept the kernel from sending the first batches
    (100,000 no-op items: 2.3-3.1 us per item against 1.5-1.8 untagged).
    Any other iterable's first items are noted as they are read; past those,
    the engine reads the user's iterator itself (no Python call per item).
    :func:`job_items` counts the items from the job.
    """

    def __init__(self, iterable: Iterable, tag: ItemTag):
        self._source = iterable
        self._it: Iterator | None = None
        self.tag = tag
        self._items: list[tuple[str, dict[str, Any]]] = []
        #: what :func:`job_items` found once the job ended
        self.final: dict[str, Any] | None = None

    def __len__(self) -> int:
        return len(self._source)  # type: ignore[arg-type]  # TypeError where it has none, as len() would raise

    def __iter__(self) -> Iterator:
        if self._it is None:
            source = iter(self._source)
            indexable = type(self._source) in _INDEXABLE
            plain = indexable or not self.tag.sweep  # a plain map's items are not listed
            self._it = source if plain else itertools.chain(self._head(source), source)
        return self._it

    def _head(self, source: Iterator) -> Iterator:
        for item in itertools.islice(source, MAX_ITEMS):
            self._items.append(self._describe(item))
            yield item

    def _describe(self, item: Any) -> tuple[str, dict[str, Any]]:
        try:
            return self.tag.describe(item)
        except Exception:  # an item whose config cannot be read still runs
            return ("?", {})

    def noted(self, read: int) -> list[tuple[str, dict[str, Any]]]:
        """``(key, config)`` of the first items the map read (at most :data:`MAX_ITEMS`), ``read`` of them in all."""
        source = self._source
        if type(source) in _INDEXABLE and len(self._items) < min(read, MAX_ITEMS):
            seq: Any = source
            self._items = [self._describe(seq[k]) for k in range(min(read, len(seq), MAX_ITEMS))]
        return self._items

    def release(self) -> None:
        """Let go of the user's iterable: a tap is kept after its map (:func:`job_items`), its inputs are not."""
        self._source = ()
        self._it = iter(())
        self.tag.cached = None  # the describe() cache holds the last item


# -- named runs: with jc.run(name, config=...) ------------------------------------------
#: the %%parallel run whose MapJob is being made in this thread (its observer reads it)
_pending = threading.local()


class Run:
    """A named run: every map, ``%%spmd`` cell and kernel-side ``report()`` inside its ``with`` block.

    Made by :func:`run`.  Its record is published on the jobs topic like a
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
                cluster=_cluster_name(),
                total=None,
                done=0,
                failed=0,
                state=self.state,
                started=self.started,
                updated=time.time(),
                kernel_id=_kernel_id(),
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
        """Keep the record here (:func:`runs`) and send it on the jobs topic (when a cluster is connected)."""
        msg = self.message()
        keep(msg)
        try:
            from ..telemetry.producer import publish
            from ..telemetry.topic_names import JOBS_TOPIC

            h = _current_handle()
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
    (:func:`tag_record`).

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
    items are tagged by its :class:`ItemTag`, which names the same run.
    """
    named = _active.get()
    if named is None or isinstance(fn, RunCall) or hasattr(fn, "cell_text"):
        return fn
    return RunCall(fn, named.id)


def run(name: str, config: Mapping[str, Any] | None = None) -> Run:
    """A named run, for use as ``with jc.run("baseline", config={"lr": 0.1}):``.

    Every map and ``%%spmd`` cell inside the block belongs to it, and
    ``report()`` calls made in the notebook inside it are tagged with it, so
    :func:`runs` and the panel show it as one row with its config.

    Parameters
    ----------
    name : str
        What the run is called in the tables.
    config : dict, optional
        Its hyperparameters (numbers, strings, bools; other values are kept as text).

    Raises
    ------
    TypeError
        For a missing name or a config that is not a dict with string keys.
    """
    return Run(name, config)


def active_run() -> Run | None:
    """The innermost :func:`run` block this code is in, or None."""
    return _active.get()


def _current_handle() -> Any:
    """The kernel's current cluster handle (None: none, or closed).

    Asked of the report producer's kernel sink, which :mod:`jupyter_cluster.cluster.session`
    installs when it is imported: runs are below sessions and do not import them.
    """
    from ..telemetry.producer import current_handle

    return current_handle()


def _cluster_name() -> str | None:
    try:
        h = _current_handle()
        return None if h is None else h.name
    except Exception:
        return None


def _kernel_id() -> str | None:
    try:
        from ..state.registry import current_kernel_id

        return current_kernel_id()
    except Exception:
        return None


# -- a map's or %%spmd cell's record --------------------------------------------------
class starting:
    """``with starting(tap):`` around making a ``%%parallel`` MapJob: its record names the tap's run.

    ``origin`` (``{"notebook", "cell", "kernel_id"}``) stands for where the map
    came from when that is not this process: a detached job's host has no
    notebook and no cell, so it passes the submitting kernel's.
    """

    def __init__(self, tap: ItemTap | None, origin: Mapping[str, Any] | None = None):
        self.tap = tap
        self.origin = origin

    def __enter__(self) -> ItemTap | None:
        _pending.tap = self.tap
        _pending.origin = self.origin
        return self.tap

    def __exit__(self, *exc: Any) -> None:
        _pending.tap = None
        _pending.origin = None


def origin() -> dict[str, Any]:
    """Where a map started here comes from: this kernel's notebook, cell and kernel id (what a detached job carries)."""
    return {"notebook": notebook_path(), "cell": cell_info(), "kernel_id": _kernel_id()}


#: job id -> the ItemTap of a %%parallel map (for its items at the end), newest last
_taps: OrderedDict[str, ItemTap] = OrderedDict()


#: the cell whose maps form one run: (id of IPython's result being filled, prompt number, run id, jobs so far)
_cell_run: list[Any] = [None, None, "", 0]


def _run_of_cell(job_id: str) -> tuple[str, int]:
    """The run of the maps of the cell now running (its id, and this job's number in it).

    Every map a cell makes (an ES loop's ``evaluate`` per generation) belongs
    to one run; outside IPython each map is a run of its own.
    """
    ip = _shell()
    result = getattr(getattr(ip, "displayhook", None), "exec_result", None) if ip is not None else None
    if result is None:
        return job_id, 1
    mark = (id(result), getattr(result, "execution_count", None))
    if (_cell_run[0], _cell_run[1]) != mark:
        _cell_run[:] = [mark[0], mark[1], job_id, 0]
    _cell_run[3] += 1
    return _cell_run[2], _cell_run[3]


def job_context(job: Any) -> dict[str, Any]:
    """The run fields of ``job``'s messages: run, kind, notebook, cell, config, context.

    Called once per job, in the kernel, when its observer is made (the cell is
    still running then).  ``context`` holds ``job`` (the job's number in its
    run: the generation of an ES loop), and inside :func:`run` the run's name
    and what :meth:`Run.set` gave.
    """
    tap: ItemTap | None = getattr(_pending, "tap", None)
    named = active_run()
    kind = "spmd" if type(job).__name__ == "SpmdJob" else "map"
    job_id = str(getattr(job, "id", ""))
    number = 1
    if tap is not None:  # a sweep: a run of its own, or inside a named run that run (ItemTag took its id)
        run_id = tap.tag.run
        _taps[job_id] = tap
        while len(_taps) > 64:
            _taps.popitem(last=False)
    elif named is not None:
        run_id = named.id
    else:
        run_id, number = _run_of_cell(job_id)
    source: Mapping[str, Any] | None = getattr(_pending, "origin", None)
    ctx: dict[str, Any] = {
        "run": run_id,
        "kind": kind,
        "notebook": notebook_path() if source is None else source.get("notebook"),
        "cell": cell_info() if source is None else source.get("cell"),
        "config": {},
        "context": {"job": number},
    }
    if source is not None and source.get("kernel_id"):
        ctx["kernel_id"] = source["kernel_id"]  # the server follows a renamed notebook by its kernel
    if named is not None:
        named.jobs.append(job_id)
        ctx["context"] = dict(named.context, run=named.name, run_id=named.id, job=len(named.jobs))
        ctx["config"] = dict(named.config)
    return ctx


def job_items(job: Any) -> dict[str, Any]:
    """The end-of-job fields of a ``%%parallel`` map: ``items`` (key, config, state, seconds) and ``item_count``.

    At most :data:`MAX_ITEMS` items and about :data:`MAX_ITEMS_BYTES` of
    their configs (the message goes through the scheduler's event log).
    """
    tap = _taps.get(str(getattr(job, "id", "")))
    if tap is None:
        return {}
    if not tap.tag.sweep:  # a plain map: one row for the run, no item list
        if getattr(job, "state", "") != "running":
            tap.release()
        return {}
    if tap.final is not None:
        return tap.final
    errors = getattr(job, "errors", None) or {}
    try:
        if hasattr(job, "durations_below"):  # a MapJob: only the listed items' (not a dict of the whole map)
            durations = job.durations_below(MAX_ITEMS)
        else:
            durations = job.durations if hasattr(job, "durations") else {}
    except Exception:
        durations = {}
    job_state = getattr(job, "state", "")
    results_known = getattr(job, "done", 0) + getattr(job, "failed", 0)
    items = []
    size = 0
    read = int(getattr(job, "items_read", 0) or 0)
    for index, (key, config) in enumerate(tap.noted(read)):
        if index in errors:
            state = "failed"
        elif index in durations or (job_state == "finished" and index < results_known):
            state = "finished"
        else:
            state = "cancelled" if job_state != "running" else "running"
        size += 60 + len(key) + sum(len(k) + len(str(v)) + 6 for k, v in config.items())
        if size > MAX_ITEMS_BYTES:
            break
        items.append({"index": index, "key": key, "config": config, "state": state, "duration": durations.get(index)})
    out = {"items": items, "item_count": read}
    if job_state != "running":
        tap.final = out  # the job ended: its items no longer change
        tap.release()
    return out


# -- what this kernel keeps -----------------------------------------------------------
_kept: OrderedDict[str, dict[str, Any]] = OrderedDict()
_kept_lock = threading.Lock()


def keep(msg: dict[str, Any]) -> None:
    """Keep a job or run message (its newest version) for :func:`runs`.

    The oldest go beyond :data:`KEEP_RUNS` messages; beyond
    :data:`KEEP_ITEMS` sweep items in all, the oldest sweeps lose their
    item lists (the table then has a row for each item that reported only).
    """
    with _kept_lock:
        old = _kept.pop(msg["job"], None)
        merged = dict(old or {}, **msg)
        if old is not None and "items" not in msg and "items" in old:
            merged["items"] = old["items"]
        _kept[msg["job"]] = merged
        while len(_kept) > KEEP_RUNS:
            _kept.popitem(last=False)
        if "items" in msg:
            total = sum(len(m.get("items") or ()) for m in _kept.values())
            for m in _kept.values():
                if total <= KEEP_ITEMS or m is merged:
                    break
                total -= len(m.pop("items", None) or ())


def kept_jobs() -> list[dict[str, Any]]:
    """The job and run messages this kernel keeps, oldest first."""
    with _kept_lock:
        return [dict(m) for m in _kept.values()]


# -- the table ----------------------------------------------------------------------------
def group_runs(jobs: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Job messages grouped into run records: ``run id -> record``.

    A record has the run's fields (name, kind, notebook, cell, cluster, kernel,
    started, ended, duration, state, total/done/failed, failures, config,
    context), the ids of its ``jobs`` and its ``items`` (from its maps'
    end-of-job messages).  A map outside any named run is a run of its own.
    """
    out: dict[str, dict[str, Any]] = {}
    for j in sorted(jobs, key=lambda j: float(j.get("started") or 0)):
        tag = j.get("run")
        run_id = tag if isinstance(tag, str) and tag else str(j["job"])
        rec = out.get(run_id)
        named = j.get("kind") == "run"
        if rec is None:
            rec = out[run_id] = {
                "run": run_id,
                "name": None,
                "kind": j.get("kind") if j.get("kind") in RUN_KINDS else "map",
                "label": j.get("label"),
                "notebook": j.get("notebook"),
                "cell": j.get("cell"),
                "cluster": j.get("cluster"),
                "kernel_id": j.get("kernel_id"),
                "started": j.get("started"),
                "ended": None,
                "duration": None,
                "state": j.get("state"),
                "total": 0,
                "done": 0,
                "failed": 0,
                "failures": [],
                "config": {},
                "context": {},
                "jobs": [],
                "items": [],
                "item_count": 0,
            }
        if named:
            rec.update(kind="run", label=j.get("label"), state=j.get("state"), notebook=j.get("notebook"))
            rec["cell"] = j.get("cell") or rec["cell"]
            rec["config"] = dict(j.get("config") or {}, **rec["config"])
            rec["started"] = j.get("started")
            if j.get("ended") is not None:
                rec["ended"] = j.get("ended")
            continue
        rec["jobs"].append(j["job"])
        for k in ("total", "done", "failed"):
            rec[k] += int(j.get(k) or 0)
        rec["failures"] = (rec["failures"] + list(j.get("failures") or []))[:5]
        if not rec["config"]:
            rec["config"] = dict(j.get("config") or {})
        if j.get("context"):
            rec["context"] = dict(j.get("context") or {})
        if rec["kind"] != "run":
            rec["state"] = _worse(rec["state"], j.get("state"), first=len(rec["jobs"]) == 1)
            if j.get("state") != "running":
                rec["ended"] = max(float(rec["ended"] or 0), float(j.get("updated") or 0)) or None
        for it in j.get("items") or []:
            if len(rec["items"]) < MAX_ITEMS:
                rec["items"].append(dict(it))
        rec["item_count"] += int(j.get("item_count") or 0)
    for rec in out.values():
        if rec["name"] is None:
            rec["name"] = run_name(rec)
        if rec["state"] == "running":  # one of its jobs still runs: not ended, whatever the others did
            rec["ended"] = None
        start = rec["started"]
        end = rec["ended"]
        if isinstance(start, (int, float)):
            rec["duration"] = (end if isinstance(end, (int, float)) else time.time()) - start
    return out


def _worse(a: Any, b: Any, first: bool) -> Any:
    if first or a is None:
        return b
    order = ["finished", "cancelled", "lost", "failed", "running"]
    rank = {s: i for i, s in enumerate(order)}
    return a if rank.get(a, 0) >= rank.get(b, 0) else b


def run_name(rec: Mapping[str, Any]) -> str:
    """What a run is called: ``"02-sweep.ipynb · In [7] · %%parallel cfg in grid"`` (the parts known)."""
    parts = []
    nb = rec.get("notebook")
    if nb:
        parts.append(os.path.basename(str(nb)))
    cell = rec.get("cell") or {}
    if cell.get("execution_count") is not None:
        parts.append(f"In [{cell['execution_count']}]")
    label = rec.get("label") if rec.get("kind") == "run" else (cell.get("first_line") or rec.get("label"))
    if label:
        parts.append(str(label))
    return " · ".join(parts) or str(rec.get("run"))


def table(
    records: Iterable[Mapping[str, Any]],
    metrics: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None,
) -> list[dict[str, Any]]:
    """The sweep table: one row per item of a sweep, one per run otherwise.

    Parameters
    ----------
    records : iterable of dict
        Run records (:func:`group_runs`).
    metrics : dict
        ``run id -> item key ("" for the run itself) -> summary`` as
        :meth:`TopicStore.run_items` gives it (merged over topics).

    Returns
    -------
    list of dict
        Each row: ``run``, ``name``, ``notebook``, ``cell``, ``state``,
        ``item`` (index or None), ``key``, ``started``, ``duration``, then
        ``config`` (dict), ``final`` and ``best`` (metric -> value) and ``steps``.
    """
    metrics = metrics or {}
    rows: list[dict[str, Any]] = []
    for rec in records:
        by_item = metrics.get(rec["run"]) or {}
        run_level = by_item.get("") or {}
        cell = rec.get("cell") or {}
        base = {
            "run": rec["run"],
            "name": rec.get("name"),
            "notebook": rec.get("notebook"),
            "cell": cell.get("execution_count"),
            "cluster": rec.get("cluster"),
            "started": rec.get("started"),
        }
        items = rec.get("items") or []
        keys = {it.get("key") for it in items}
        extra = [k for k in by_item if k and k not in keys]  # items that reported but were not listed (a long map)
        if not items and not extra:
            rows.append(
                dict(
                    base,
                    item=None,
                    key=None,
                    state=rec.get("state"),
                    duration=rec.get("duration"),
                    config=dict(rec.get("config") or {}, **(run_level.get("config") or {})),
                    final=dict(run_level.get("final") or {}),
                    best=dict(run_level.get("best") or {}),
                    steps=run_level.get("steps"),
                )
            )
            continue
        listed = [
            (it.get("index"), it.get("key"), it.get("config") or {}, it.get("state"), it.get("duration"))
            for it in items
        ]
        listed += [(None, k, {}, "finished", None) for k in extra]
        for index, key, config, state, duration in listed:
            m = by_item.get(key) or {}
            rows.append(
                dict(
                    base,
                    item=index,
                    key=key,
                    state=state,
                    duration=duration,
                    config=dict(rec.get("config") or {}, **config, **(m.get("config") or {})),
                    final=dict(m.get("final") or {}),
                    best=dict(m.get("best") or {}),
                    steps=m.get("steps"),
                )
            )
    return rows


def merge_metrics(stores: Iterable[Any], runs: Iterable[str] | None = None) -> dict[str, dict[str, dict[str, Any]]]:
    """``run -> item key -> {"config", "final", "best", "steps"}`` over several TopicStores.

    A metric reported on two topics is named ``topic/metric`` in both.
    """
    wanted = set(runs) if runs is not None else None
    per_topic = [(s.topic, s.run_items(wanted)) for s in stores]
    counts: dict[str, int] = {}
    for _, data in per_topic:
        names = {m for items in data.values() for it in items.values() for m in it["final"]}
        for m in names:
            counts[m] = counts.get(m, 0) + 1
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for topic, data in per_topic:
        for run_id, items in data.items():
            for key, it in items.items():
                dst = out.setdefault(run_id, {}).setdefault(key, {"config": {}, "final": {}, "best": {}, "steps": None})
                dst["config"].update(it["config"])
                for m, v in it["final"].items():
                    dst["final"][m if counts.get(m, 0) < 2 else f"{topic}/{m}"] = v
                for m, v in it["best"].items():
                    dst["best"][m if counts.get(m, 0) < 2 else f"{topic}/{m}"] = v
                if it.get("steps") is not None:
                    dst["steps"] = max(dst["steps"] or 0, it["steps"])
    return out


def merge_curves(stores: Iterable[Any], run: str) -> dict[str, dict[str, list[list[Any]]]]:
    """``metric -> item key -> [step, value] points`` of one run over several TopicStores.

    Each item keeps its own curve per metric (at most
    ``store.CURVE_POINTS`` points, spread over the run), whatever series its
    reports went to, so the rows of a sweep can be overlaid.  A metric on two
    topics is named ``topic/metric``, as in :func:`merge_metrics`.
    """
    per_topic = [(s.topic, s.run_items({run}, curves=True).get(run) or {}) for s in stores]
    counts: dict[str, int] = {}
    for _, items in per_topic:
        for m in {m for it in items.values() for m in it.get("curves") or {}}:
            counts[m] = counts.get(m, 0) + 1
    out: dict[str, dict[str, list[list[Any]]]] = {}
    for topic, items in per_topic:
        for key, it in items.items():
            for m, points in (it.get("curves") or {}).items():
                out.setdefault(m if counts.get(m, 0) < 2 else f"{topic}/{m}", {})[key] = points
    return out


def frame(rows: list[dict[str, Any]]) -> Any:
    """The sweep table as a pandas DataFrame: config columns, then each metric's final and ``.best`` value."""
    import pandas as pd

    config_cols: list[str] = []
    metric_cols: list[str] = []
    flat = []
    for r in rows:
        d = {k: r.get(k) for k in ("run", "name", "notebook", "cell", "item", "state", "duration")}
        for k, v in r["config"].items():
            if k not in config_cols:
                config_cols.append(k)
            d[k] = v
        for k, v in r["final"].items():
            if k not in metric_cols:
                metric_cols.append(k)
            d[k] = v
        for k, v in r["best"].items():
            d[f"{k}.best"] = v
        flat.append(d)
    fixed = ["run", "name", "notebook", "cell", "item", "state", "duration"]
    taken = set(fixed)
    config_cols = [c for c in config_cols if c not in taken]
    metric_cols = [c for c in metric_cols if c not in taken and c not in config_cols]
    columns = fixed + config_cols + [c for m in metric_cols for c in (m, f"{m}.best")]
    df = pd.DataFrame(flat, columns=columns)
    for col in ("cell", "item"):  # whole numbers with gaps (a run has no item index)
        df[col] = df[col].astype("Int64")
    return df


def runs(notebook: str | None = None, cluster: str | None = None, run: str | None = None, kept: bool = True) -> Any:
    """This kernel's runs as the sweep table: a pandas DataFrame, one row per item (or run).

    Columns: ``run``, ``name``, ``notebook``, ``cell``, ``item``, ``state``,
    ``duration``, one per config key, then for each reported metric its final
    value (``loss``) and its best (``loss.best``: the lowest for names with
    loss/error/err/regret in them, else the highest).  The server's
    ``GET …/api/runs/<id>`` serves the same rows to the panel.

    Parameters
    ----------
    notebook, cluster : str, optional
        Only runs of this notebook path / cluster.
    run : str, optional
        Only this run (its id).
    kept : bool, default True
        Also list this notebook's earlier runs that the Jupyter server kept in
        its history folder (``<jupyter runtime dir>/jupyter-cluster-history``)
        when their cluster stopped, so that they survive a kernel restart;
        with their final/best metrics where the server had them.  Only this
        user's 0600 files are read; runs this kernel still holds come from the
        kernel.  ``notebook`` (else this kernel's notebook) picks them; a
        kernel that knows no notebook lists none.
    """
    # the reports of a map that just ended are at the scheduler, perhaps not yet here (as for metrics())
    from ..telemetry.hub import attach, sync
    from ..telemetry.topic_store import all_stores

    handle = _current_handle()
    if handle is not None:
        attach(handle.client)
    sync()
    from .detached_runs import detached_runs

    nb = notebook if notebook is not None else notebook_path()
    records = group_runs(detached_runs(nb) + kept_jobs())
    chosen = [
        r
        for r in records.values()
        if (notebook is None or _same_notebook(r.get("notebook"), notebook))
        and (cluster is None or r.get("cluster") == cluster)
        and (run is None or r["run"] == run)
    ]
    rows = table(chosen, merge_metrics(all_stores(), [r["run"] for r in chosen]))
    if kept and nb:
        old_records, old_metrics = kept_runs(nb, skip=set(records))
        old_chosen = [
            r
            for r in old_records.values()
            if (cluster is None or r.get("cluster") == cluster) and (run is None or r["run"] == run)
        ]
        rows = table(old_chosen, old_metrics) + rows  # older runs first, as the kernel's are
    return frame(rows)


# -- what the server kept: runs of earlier kernels -----------------------------------------
class _KeptTopic:
    """A kept topic's run items, as :func:`merge_metrics` reads a TopicStore's (the server's KeptTopic's rule)."""

    def __init__(self, topic: str, items: dict[str, dict[str, dict[str, Any]]]):
        self.topic = topic
        self.items = items

    def run_items(self, runs: set[str] | None = None, curves: bool = False) -> dict[str, dict[str, dict[str, Any]]]:
        return kept_run_items(self.items, runs, curves)


_NUMBERS = ("started", "updated", "ended")
_COUNTS = ("total", "done", "failed", "item_count")


def _kept_job(j: Any) -> dict[str, Any] | None:
    """A job message from a history file, its fields of the types :func:`group_runs` reads, or None."""
    if not isinstance(j, dict) or not isinstance(j.get("job"), str) or not j["job"]:
        return None
    out = {k: v for k, v in j.items() if k not in _NUMBERS + _COUNTS}
    for k in _NUMBERS:
        v = j.get(k)
        out[k] = v if isinstance(v, (int, float)) and not isinstance(v, bool) else None
    for k in _COUNTS:
        v = j.get(k)
        out[k] = v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0
    for k, kind in (("config", dict), ("context", dict), ("cell", dict), ("failures", list), ("items", list)):
        if not isinstance(out.get(k), kind):
            out.pop(k, None)
    if isinstance(out.get("items"), list):
        out["items"] = [it for it in out["items"][:MAX_ITEMS] if isinstance(it, dict)]
    for k in ("run", "kind", "label", "notebook", "cluster", "state", "kernel_id"):
        if out.get(k) is not None and not isinstance(out[k], str):
            out.pop(k)
    return out


def kept_runs(
    notebook: str, skip: set[str] | frozenset[str] = frozenset(), folder: str | None = None
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, dict[str, Any]]]]:
    """The runs of ``notebook`` the server kept in its history folder, and their metrics.

    Parameters
    ----------
    notebook : str
        The notebook's path (as :func:`notebook_path` gives it, or under the server's root).
    skip : set of str
        Run ids left out (those the kernel still holds).
    folder : str, optional
        The history folder; the server's (:func:`jupyter_cluster.state.history_files.history_dir`) by default.

    Returns
    -------
    (dict, dict)
        ``run id -> record`` (:func:`group_runs`) and ``run id -> item key -> summary``
        (:func:`merge_metrics`).  Only this user's regular 0600 files are read; an
        unreadable or damaged one is skipped (a debug log names it).
    """
    import logging

    from ..state.history_files import MAX_FILE_BYTES, history_dir, history_files, read_json

    logger = logging.getLogger(__name__)
    records: dict[str, dict[str, Any]] = {}
    per_run: dict[str, dict[str, dict[str, Any]]] = {}
    seen: set[str] = set()
    for path in reversed(history_files(folder or history_dir())):  # newest first: a job kept twice is its newest
        try:
            data = read_json(path, MAX_FILE_BYTES, private=True)
            if not isinstance(data, dict) or not isinstance(data.get("jobs") or [], list):
                raise ValueError("not a kept cluster's file")
            jobs = []
            for raw in data.get("jobs") or []:
                j = _kept_job(raw)
                if j is None or j["job"] in seen or not _same_path(j.get("notebook"), notebook):
                    continue
                jobs.append(j)
            found = {r: rec for r, rec in group_runs(jobs).items() if r not in skip and r not in records}
            if not found:
                continue
            seen.update(j["job"] for j in jobs)
            topics = [
                _KeptTopic(str(t.get("topic") or i), checked_run_items(t.get("runs")))
                for i, t in enumerate(data.get("topics") or [])
                if isinstance(t, dict)
            ]
            metrics = merge_metrics(topics, list(found))
        except (OSError, ValueError, TypeError, KeyError, RecursionError) as exc:
            logger.debug("jupyter-cluster: runs() skips the history file %s: %s", path, exc)
            continue
        records.update(found)
        per_run.update(metrics)
    ordered = dict(sorted(records.items(), key=lambda kv: float(kv[1].get("started") or 0)))
    return ordered, per_run


def _same_path(kept: Any, asked: str) -> bool:
    """:func:`_same_notebook` either way round (a kernel's path may be absolute, the other relative)."""
    return isinstance(kept, str) and (_same_notebook(kept, asked) or _same_notebook(asked, kept))


def _same_notebook(kept: Any, asked: str) -> bool:
    """Whether the notebook a run names (absolute where the server gave the kernel its full path) is ``asked``."""
    if not isinstance(kept, str):
        return False
    return kept == asked or kept.endswith("/" + asked.lstrip("/"))
