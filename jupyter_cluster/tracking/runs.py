"""The public ``jc.run()`` and ``jc.runs()``: a named run, and this kernel's runs as the sweep table.

A *run* is what a researcher compares: the jobs of one cell (or of one named
``with jc.run(name, config=...)`` block), the notebook and cell that started
them, when, for how long, how it ended, and the hyperparameters it was given.
For ``%%parallel cfg in grid`` each *item* is a row of the sweep table: its
config is the item's value (a dict, or the named targets of
``%%parallel lr, mom in grid``), to which ``report(..., config=...)`` adds.

The parts live beside this module: :mod:`.kernel` (where the kernel is),
:mod:`.tags` (the tag a ``%%parallel`` cell's items carry), :mod:`.context`
(named runs), :mod:`.record` (a map's record and what this kernel keeps),
:mod:`.table` (the runs table) and :mod:`.kept` (what the server kept).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .context import Run
from .kept import kept_runs, same_notebook
from .kernel import current_handle, notebook_path
from .record import kept_jobs
from .table import frame, group_runs, merge_metrics, table


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

    handle = current_handle()
    if handle is not None:
        attach(handle.client)
    sync()
    from .detached_runs import detached_runs

    nb = notebook if notebook is not None else notebook_path()
    records = group_runs(detached_runs(nb) + kept_jobs())
    chosen = [
        r
        for r in records.values()
        if (notebook is None or same_notebook(r.get("notebook"), notebook))
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
