"""The scheduler's Bokeh dashboard, attached after the cluster has started instead of during its start.

Importing ``distributed.dashboard.scheduler`` (Bokeh and Dask's dashboard
components) costs about 0.9 s of CPU, as much as importing distributed itself,
and a scheduler made with a dashboard pays it before its first worker can
connect: it was the largest step of a first ``%cluster start``.  A local
cluster's scheduler is made without its Bokeh application (its HTTP server
still listens, with Dask's other routes: health, Prometheus, JSON); the
application is added to the same server afterwards, as
``Scheduler.__init__`` would have (:func:`attach_later`):

* at once when the import is done already (``%load_ext`` imports it in the
  background while the next cell is written);
* else by a background thread :data:`DELAY_SECONDS` after the start, so that
  the first map of a notebook run top to bottom does not share the CPU with
  the import;
* or by the first HTTP request the scheduler gets before then (someone opens
  the dashboard at once): that request waits for the import, so every
  dashboard URL answers as it would have from the start.
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any

logger = logging.getLogger(__name__)

#: How long after the start the dashboard's import begins in the background, in seconds.
DELAY_SECONDS = 1.0

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
        # On the scheduler's loop.  A request before the attach (someone opened the dashboard at once)
        # waits for it here: blocking the loop once, for the rest of the import, rather than a 404.
        if not self.done:
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
        if getattr(getattr(scheduler, "status", None), "name", "running") in ("closing", "closed", "failed"):
            return
        try:
            module = self._import()
            module.connect(app, scheduler.http_server, scheduler, prefix="/")
        except Exception:  # noqa: BLE001 - a broken bokeh: the cluster runs on without its dashboard
            logger.warning("jupyter_cluster: the scheduler's dashboard could not start", exc_info=True)

    def in_background(self, delay: float) -> None:
        def run() -> None:
            if delay > 0:
                threading.Event().wait(delay)
            if self.done:
                return
            try:
                self._import()  # off the loop: the loop only adds the application
            except Exception:  # noqa: BLE001 - reported by _connect, which imports again
                pass
            try:
                self.loop.add_callback(self._connect)
            except Exception:  # noqa: BLE001 - the cluster closed meanwhile
                pass

        threading.Thread(target=run, name="jupyter-cluster-dashboard", daemon=True).start()


def attach_later(cluster: Any, delay: float = DELAY_SECONDS) -> None:
    """Give ``cluster``'s scheduler (made with ``dashboard=False``) its Bokeh dashboard (see the module's doc)."""
    scheduler = getattr(cluster, "scheduler", None)
    if getattr(scheduler, "http_application", None) is None:
        return
    attach = _Attach(scheduler, cluster.loop)
    if MODULE in sys.modules:
        cluster.sync(_on_loop, attach._connect)  # imported already: only the application to add
    else:
        attach.in_background(delay)


async def _on_loop(fn: Any) -> None:
    fn()
