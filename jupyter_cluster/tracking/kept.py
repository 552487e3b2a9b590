"""What the server kept: the runs of earlier kernels, read from its history files.

The Jupyter server writes a stopped cluster's jobs and metrics into 0600 files
(:mod:`jupyter_cluster.state.history_files`); ``jc.runs()`` lists a notebook's
runs from them, so that they survive a kernel restart.
"""

from __future__ import annotations

from typing import Any

from ..state.history_files import checked_run_items, kept_run_items
from .table import group_runs, merge_metrics
from .tags import MAX_ITEMS


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
    """:func:`same_notebook` either way round (a kernel's path may be absolute, the other relative)."""
    return isinstance(kept, str) and (same_notebook(kept, asked) or same_notebook(asked, kept))


def same_notebook(kept: Any, asked: str) -> bool:
    """Whether the notebook a run names (absolute where the server gave the kernel its full path) is ``asked``."""
    if not isinstance(kept, str):
        return False
    return kept == asked or kept.endswith("/" + asked.lstrip("/"))
