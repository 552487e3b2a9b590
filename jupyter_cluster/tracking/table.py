"""The runs table: job messages grouped into run records, joined with their metrics, as rows or a DataFrame.

The kernel's ``jc.runs()`` (:mod:`.runs`) and the server's ``GET …/api/runs/<id>`` build it alike.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

from .tags import MAX_ITEMS

RUN_KINDS = ("map", "spmd", "run")


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
