"""A kernel told that its notebook was renamed or moved: its later runs name the new path.

A kernel knows its notebook by ``JPY_SESSION_NAME`` (and ipykernel's
``__session__``), set when it started; JupyterLab renames a notebook by
changing its session's path, which the Jupyter server follows
(:mod:`jupyter_cluster.server.renames`) and the kernel's environment does not.
The panel's front end calls :func:`follow_rename` in the kernel (a silent
execution) when the path changes, so that the runs the kernel keeps and
publishes, and ``jc.runs()``'s kept history, use the new path.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def _moved(path: str, old: str, new: str) -> str | None:
    """``path`` (absolute, or as the server names it) with its ``old`` ending replaced by ``new``, or None."""
    old, new = old.lstrip("/"), new.lstrip("/")
    if path == old:
        return new
    if path.endswith("/" + old):
        return path[: len(path) - len(old)] + new
    return None


def follow_rename(old: str, new: str) -> str | None:
    """The kernel's notebook ``old`` (as the browser names it) is now ``new``; returns the kernel's new path, or None.

    Nothing changes when the kernel's notebook is not ``old`` (a message for
    another kernel, or one that came twice).  The runs this kernel keeps
    (:func:`jupyter_cluster.tracking.record.kept_jobs`) are re-keyed too.
    """
    if not isinstance(old, str) or not isinstance(new, str) or not old or not new:
        raise ValueError("follow_rename needs the notebook's old and new paths.")
    from .kernel import ipython_shell, notebook_path
    from .record import rename_notebook

    current = notebook_path()
    moved = _moved(current, old, new) if current else None
    if moved is None:
        return None
    os.environ["JPY_SESSION_NAME"] = moved
    shell = ipython_shell()
    ns: Any = getattr(shell, "user_ns", None) or getattr(sys.modules.get("__main__"), "__dict__", None)
    if isinstance(ns, dict) and "__session__" in ns:
        ns["__session__"] = moved
    rename_notebook(current, moved)
    return moved
