"""The scheduler's Bokeh dashboard, attached after the cluster has started instead of during its start.

Importing ``distributed.dashboard.scheduler`` (Bokeh and Dask's dashboard
components) costs about 0.9 s of CPU, as much as importing distributed itself,
and a scheduler made with a dashboard pays it before its first worker can
connect: it was the largest step of a first ``%cluster start``.  A local
cluster's scheduler is made without its Bokeh application (its HTTP server
still listens, with Dask's other routes: health, Prometheus, JSON); the
application is added to the same server afterwards, as
``Scheduler.__init__`` would have (:func:`attach_later`):

* at once when the import is done already (an earlier cluster's dashboard
  imported it meanwhile; a start that finds it imported makes its scheduler
  with the dashboard, as Dask does);
* else by a background thread once this process has been idle for
  :data:`IDLE_SECONDS` (the user writes the next cell): not while a notebook
  run top to bottom runs its cells, whose first map would share the CPU (and
  the GIL) with the import;
* or by the first request for a dashboard page before then (someone opens
  the dashboard; Dask's other routes answer without it): that request waits
  for the import, on the scheduler's event loop, so every dashboard URL
  answers as it did from the start, the first one about a second later.
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any

logger = logging.getLogger(__name__)

#: The dashboard's import begins in the background once this process has been idle this long, in seconds.
IDLE_SECONDS = 2.0
#: Idle: less CPU than this fraction of one core, measured over each :data:`IDLE_SLICE` seconds.
IDLE_CPU = 0.1
IDLE_SLICE = 0.5

MODULE = "distributed.dashboard.scheduler"


def wanted(dashboard_address: Any) -> bool:
    """Whether a scheduler started with ``dashboard_address`` would show the Bokeh dashboard (bokeh installed)."""
    if dashboard_address is None:
        return False
    if MODULE in sys.modules:
        return True
    import importlib.util

    return importlib.util.find_spec("bokeh") is not None


class _Attach:
    """Adds the Bokeh application to one scheduler's HTTP server, once, on the scheduler's event loop."""

    def __init__(self, scheduler: Any, loop: Any):
        self.scheduler = scheduler
        self.loop = loop
        self.done = False
        self.lock = threading.Lock()  # the import: the background thread's, or a request's on the loop
        app = scheduler.http_application
        self.find_handler = app.find_handler
        app.find_handler = self._find_handler  # an instance attribute: this scheduler's application only

    def _find_handler(self, request: Any, **kwargs: Any) -> Any:
        # On the scheduler's loop.  A dashboard page asked for before the attach (someone opened the
        # dashboard at once) waits for it here: blocking the loop once, for the rest of the import,
        # rather than a 404.  Dask's own routes (health, metrics, JSON) answer without it.
        from tornado.web import ErrorHandler

        found = self.find_handler(request, **kwargs)
        if self.done or (found is not None and not issubclass(found.handler_class, ErrorHandler)):
            return found
        self._connect()
        return self.find_handler(request, **kwargs)

    def _import(self) -> Any:
        with self.lock:
            import importlib

            return importlib.import_module(MODULE)

    def _connect(self) -> None:
        """Add the application (on the scheduler's loop; a no-op once done or once the scheduler closed)."""
        if self.done:
            return
        self.done = True
        scheduler = self.scheduler
        app = scheduler.http_application
        if app.find_handler == self._find_handler:
            del app.find_handler  # back to the class's method: no check per request from now on
        if self.closed():
            return
        try:
            module = self._import()
            module.connect(app, scheduler.http_server, scheduler, prefix="/")
        except Exception:  # noqa: BLE001 - a broken bokeh: the cluster runs on without its dashboard
            logger.warning("jupyter_cluster: the scheduler's dashboard could not start", exc_info=True)

    def closed(self) -> bool:
        return getattr(getattr(self.scheduler, "status", None), "name", "running") in ("closing", "closed", "failed")

    def in_background(self, idle: float) -> None:
        def run() -> None:
            import time

            quiet, pause = 0.0, threading.Event()
            used = time.process_time()
            while quiet < idle:  # this process's CPU (every thread), not the machine's
                pause.wait(IDLE_SLICE)
                if self.done or self.closed():
                    return
                now = time.process_time()
                quiet = quiet + IDLE_SLICE if now - used < IDLE_CPU * IDLE_SLICE else 0.0
                used = now
            try:
                self._import()  # off the loop: the loop only adds the application
            except Exception:  # noqa: BLE001 - reported by _connect, which imports again
                pass
            try:
                self.loop.add_callback(self._connect)
            except Exception:  # noqa: BLE001 - the cluster closed meanwhile
                pass

        threading.Thread(target=run, name="jupyter-cluster-dashboard", daemon=True).start()


def attach_later(cluster: Any, idle: float = IDLE_SECONDS) -> None:
    """Give ``cluster``'s scheduler (made with ``dashboard=False``) its Bokeh dashboard (see the module's doc)."""
    scheduler = getattr(cluster, "scheduler", None)
    if getattr(scheduler, "http_application", None) is None:
        return
    attach = _Attach(scheduler, cluster.loop)
    if MODULE in sys.modules:
        cluster.sync(_on_loop, attach._connect)  # imported already: only the application to add
    else:
        attach.in_background(idle)


async def _on_loop(fn: Any) -> None:
    fn()
