"""The runs of detached jobs, for ``jc.runs()`` in any kernel of the notebook that submitted them.

A detached job's map runs in its kept cluster's host, which writes the map's
run message next to the job (:func:`jupyter_cluster.state.job_store.write_run`)
with the submitting kernel's notebook and cell; this reads them back.
"""

from __future__ import annotations

from typing import Any

from .kept import _kept_job, _same_path


def detached_runs(notebook: str | None) -> list[dict[str, Any]]:
    """The run messages of this user's detached jobs submitted from ``notebook`` (none when it is None).

    Only this user's store is read; a store that is not theirs gives none.
    """
    from ..state import job_store

    if not notebook:
        return []
    out = []
    try:
        names = job_store.names()
    except Exception:  # a store that is not ours (or unreadable) has no runs for this kernel
        return []
    for name in names:
        msg = _kept_job(job_store.read_run(name))
        if msg is not None and _same_path(msg.get("notebook"), notebook):
            out.append(msg)
    return out
