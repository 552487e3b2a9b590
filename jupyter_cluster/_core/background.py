"""Imports done in the background while the user writes the next cell.

Importing Dask's distributed takes about a second on a small machine.  ``%load_ext
jupyter_cluster`` begins it in a thread (:func:`start`); a cluster start that
comes sooner waits for it (:func:`wait`), so nothing is imported twice.
ipywidgets (for the cluster's widget) comes after it, and a start does not
wait for it: it goes on while the start waits for its worker processes, and
the widget shown at the end of ``%cluster start`` waits for what is left.  The
scheduler's dashboard (bokeh, nearly as long again) is not among them: a local
cluster attaches it once the kernel is idle or the dashboard is opened
(``backends.local.dashboard``), so a notebook run top to bottom does not wait
for it.
"""

from __future__ import annotations

import threading

#: the engine, then the cluster widget's toolkit
MODULES = ("distributed", "ipywidgets")
#: what a cluster start waits for
NEEDED = "distributed"

_thread: threading.Thread | None = None
_needed_done = threading.Event()


def start() -> None:
    """Begin importing :data:`MODULES` in a daemon thread (once per process)."""
    global _thread
    if _thread is not None:
        return

    def run() -> None:
        try:
            for name in MODULES:
                try:
                    __import__(name)
                except Exception:  # the start itself reports a broken installation
                    pass
                if name == NEEDED:
                    _needed_done.set()
        finally:
            _needed_done.set()

    _thread = threading.Thread(target=run, name="jupyter-cluster-import", daemon=True)
    _thread.start()


def wait(timeout: float = 60.0) -> None:
    """Let the background import of distributed finish before a cluster starts.

    Two threads importing the same package's modules can each hold a module
    the other needs; Python then breaks the cycle by handing one of them a
    half-built module ("module 'distributed.dashboard' has no attribute
    'scheduler'").  ipywidgets shares no module with a start.
    """
    if _thread is not None:
        _needed_done.wait(timeout)
