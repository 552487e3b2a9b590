"""engine.worker: what runs on a worker process imports nothing of the notebook side."""

from __future__ import annotations

import sys

import cloudpickle

from jupyter_cluster import mapping

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def loaded_modules(x):
    return sorted(
        m for m in sys.modules if m.startswith(("jupyter_cluster", "IPython", "ipywidgets", "anywidget", "tests"))
    )


def test_worker_processes_import_only_what_runs_on_them(cluster):
    """Issue 13 start-up: no notebook side (sessions, widgets, telemetry hub, IPython) in a worker process."""
    # Fresh worker processes: earlier tests' functions can make a worker import
    # this test module (found on the workers' path), which imports the map front.
    cluster.client.restart()
    mods = mapping.map(loaded_modules, [0], client=cluster, progress=False)[0]
    assert __name__ not in mods
    assert "jupyter_cluster.engine.worker" in mods
    notebook_side = [m for m in mods if m.split(".")[0] in ("IPython", "ipywidgets", "anywidget")
                     or m in ("jupyter_cluster.session", "jupyter_cluster.mapping", "jupyter_cluster.engine.job",
                              "jupyter_cluster.widgets", "jupyter_cluster.telemetry.progress", "jupyter_cluster.magics")]  # fmt: skip
    assert not notebook_side, f"worker processes imported {notebook_side}"
