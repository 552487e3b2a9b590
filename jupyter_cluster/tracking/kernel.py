"""Where the kernel is: its notebook, the cell running, its cluster handle and kernel id.

Asked when a run or a map's record is made (:mod:`.context`, :mod:`.record`), in the kernel; a
plain script or a worker has no notebook and no cell, and gets None.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from ..telemetry.tags import _clip

#: characters of a cell's first line in a run's record
MAX_LINE = 160


def notebook_path() -> str | None:
    """The notebook this kernel runs (its path as the Jupyter server gave it), or None.

    A Jupyter server starts a session's kernel with ``JPY_SESSION_NAME`` set to
    the session's path, which ipykernel also puts in the namespace as
    ``__session__``; a kernel started otherwise (a script, nbclient) has neither.
    Since jupyter_server 2 that is the notebook's full filesystem path (the
    kernel's working directory joined with the notebook's name), not its path
    under the server's root; only a session started without a name gets the
    latter.
    """
    path = os.environ.get("JPY_SESSION_NAME")
    if not path:
        main = sys.modules.get("__main__")
        ip = ipython_shell()
        ns = getattr(ip, "user_ns", None) or getattr(main, "__dict__", {})
        path = ns.get("__session__") if isinstance(ns, dict) else None
    return _clip(path, 1000) if isinstance(path, str) and path else None


def ipython_shell() -> Any:
    """The IPython shell running this code, or None (no import of IPython where none is loaded)."""
    if "IPython" not in sys.modules:  # a plain script or a worker: no shell, and no import cost
        return None
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython is a dependency
        return None
    return get_ipython()


def cell_info() -> dict[str, Any] | None:
    """The cell being run: ``{"execution_count", "cell_id", "first_line"}``, or None outside IPython.

    IPython keeps the running cell's text and the id the front end gave it on
    the result it is filling (``displayhook.exec_result.info``).
    """
    ip = ipython_shell()
    if ip is None:
        return None
    result = getattr(getattr(ip, "displayhook", None), "exec_result", None)
    info = getattr(result, "info", None)
    raw = getattr(info, "raw_cell", None)
    count = getattr(result, "execution_count", None)
    cell_id = getattr(info, "cell_id", None)
    first = next((line.strip() for line in str(raw or "").splitlines() if line.strip()), "")
    return {
        "execution_count": count if isinstance(count, int) and not isinstance(count, bool) else None,
        "cell_id": _clip(cell_id, 128) if isinstance(cell_id, str) and cell_id else None,
        "first_line": _clip(first, MAX_LINE),
    }


def current_handle() -> Any:
    """The kernel's current cluster handle (None: none, or closed).

    Asked of the report producer's kernel sink, which :mod:`jupyter_cluster.cluster.session`
    installs when it is imported: runs are below sessions and do not import them.
    """
    from ..telemetry.producer import current_handle as producers_handle

    return producers_handle()


def cluster_name() -> str | None:
    """The name of the kernel's current cluster, or None."""
    try:
        h = current_handle()
        return None if h is None else h.name
    except Exception:
        return None


def kernel_id() -> str | None:
    """This kernel's id as the Jupyter server knows it, or None."""
    try:
        from ..state.registry import current_kernel_id

        return current_kernel_id()
    except Exception:
        return None
