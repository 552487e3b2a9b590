"""A map's or ``%%spmd`` cell's record, and the records this kernel keeps.

How the pieces meet::

    kernel: the map's job message (jobs topic) carries run, kind, notebook, cell, config
            and, at its end, the items' configs, states and durations  (:func:`job_context`,
            :func:`job_items`); :func:`keep` keeps each message for ``jc.runs()``
    task:   report() inside a %%parallel item tags each record with the run and the item's
            key (:func:`jupyter_cluster.telemetry.tags.current_item`, set by the worker around
            each item's cell), so every TopicStore keeps the item's final/best values
            (:meth:`jupyter_cluster.telemetry.topic_store.TopicStore.run_items`)
    table:  :mod:`.table` joins the two: one row per item (or per run), config columns,
            then ``<metric>`` (final) and ``<metric>.best`` columns.  The kernel's
            ``jc.runs()`` and the server's ``GET …/api/runs/<id>`` build it alike.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from ..telemetry.tags import active_run
from .kernel import cell_info, ipython_shell, kernel_id, notebook_path
from .tags import MAX_ITEMS, MAX_ITEMS_BYTES, ItemTap

#: job messages a kernel keeps for ``jc.runs()`` (oldest dropped first), and sweep items listed in them
KEEP_RUNS = 500
KEEP_ITEMS = 50_000


def origin() -> dict[str, Any]:
    """Where a map started here comes from: this kernel's notebook, cell and kernel id (what a detached job carries)."""
    return {"notebook": notebook_path(), "cell": cell_info(), "kernel_id": kernel_id()}


#: job id -> the ItemTap of a %%parallel map (for its items at the end), newest last
_taps: OrderedDict[str, ItemTap] = OrderedDict()


#: the cell whose maps form one run: (id of IPython's result being filled, prompt number, run id, jobs so far)
_cell_run: list[Any] = [None, None, "", 0]


def _run_of_cell(job_id: str) -> tuple[str, int]:
    """The run of the maps of the cell now running (its id, and this job's number in it).

    Every map a cell makes (an ES loop's ``evaluate`` per generation) belongs
    to one run; outside IPython each map is a run of its own.
    """
    ip = ipython_shell()
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
    run: the generation of an ES loop), and inside ``jc.run()`` the run's name
    and what :meth:`.context.Run.set` gave.  A ``%%parallel`` map names its
    sweep's :class:`.tags.ItemTap` as ``job.tap`` (its record names the tap's
    run); ``job.origin`` (``{"notebook", "cell", "kernel_id"}``) stands for
    where the map came from when that is not this process (a detached job's
    host has no notebook and no cell, so it passes the submitting kernel's).
    """
    tap: ItemTap | None = getattr(job, "tap", None)
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
    source: Mapping[str, Any] | None = getattr(job, "origin", None)
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
    """Keep a job or run message (its newest version) for ``jc.runs()``.

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


def rename_notebook(old: str | None, new: str) -> None:
    """The kept messages of the notebook ``old`` name ``new`` (the notebook was renamed: :mod:`.renamed`)."""
    with _kept_lock:
        for msg in _kept.values():
            if msg.get("notebook") == old:
                msg["notebook"] = new
