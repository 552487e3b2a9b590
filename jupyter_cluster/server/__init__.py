"""The Jupyter server extension: cluster list, control, jobs and metrics for the sidebar panel.

Kept import-light: tornado and jupyter_server are imported only by :func:`load`.

* :mod:`.manager` - the server's view of every cluster (no HTTP)
* :mod:`.jobs` - the latest state of every map job and the history of stopped clusters
* :mod:`.host` - the process that owns clusters started from the panel
* :mod:`.detached` - the routes of kept clusters and detached jobs (the Detached section)
* :mod:`.handlers` - REST and websocket routes under ``<base_url>/jupyter-cluster/api/``
* :mod:`.dashboard` - the Dask dashboards of local and dask-gateway clusters, under ``<base_url>/jupyter-cluster/dashboard/``
"""

from __future__ import annotations

from typing import Any


def load(serverapp: Any) -> None:
    """Register the handlers and start the manager on the server's event loop."""
    import asyncio
    import atexit

    # lazy: jupyter_server and the manager load only when a server loads the extension
    from .handlers import setup_handlers
    from .jobs import set_root_dir
    from .manager import ClusterManager
    from .renames import NotebookRenames, follow_sessions

    # kernels name their notebook by its absolute path: the panel knows it relative to the root
    set_root_dir(getattr(serverapp, "root_dir", None))
    manager = ClusterManager(base_url=serverapp.base_url)
    setup_handlers(serverapp.web_app, manager)
    # a renamed or moved notebook keeps its jobs and kept history (its session's path changes)
    follow_sessions(getattr(serverapp, "session_manager", None), NotebookRenames(manager).renamed)
    # the running clusters' jobs and metrics are written when the server stops (and every few
    # seconds while it runs), so a restarted server shows their curves from the start
    atexit.register(manager.save_live, True)

    def start() -> None:
        manager.start()

    # The server's loop may not run yet while extensions load.
    try:
        asyncio.get_running_loop()
        start()
    except RuntimeError:
        serverapp.io_loop.add_callback(start)
    serverapp.log.info("jupyter_cluster server extension loaded at %sjupyter-cluster/api/", serverapp.base_url)
