"""Notebooks followed through renames and moves: what the server keeps of a notebook moves with it.

A kernel knows its notebook by the path its session had when the kernel
started (``JPY_SESSION_NAME``); when the user renames or moves the notebook,
JupyterLab changes the session's path (``PATCH api/sessions/<id>``) and the
kernel is not told.  The server learns it here: :func:`follow_sessions` wraps
the session manager's ``update_session``, and a path that changed

* names the kernel's notebook from then on (:func:`current_notebook`: the job
  messages the kernel still sends under the old path are kept under the new one),
* re-keys the jobs the server holds, of running and of stopped clusters, and the
  history files on disk (:func:`rekey_jobs`, used by :class:`NotebookRenames`),
  so that "This notebook" and ``jc.runs()`` after a kernel restart find them.

Paths are as the browser's session names them (relative to the server's root).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable
from typing import Any

logger = logging.getLogger(__name__)

#: kernels followed at most (a long-running server renames few notebooks; the oldest are dropped first)
MAX_KERNELS = 10_000

_lock = threading.Lock()
#: kernel id -> its notebook's path now (set when its session's path changed)
_kernel_paths: dict[str, str] = {}
#: old path -> new path, for messages that name no kernel
_moved: dict[str, str] = {}


def note_rename(old: str, new: str, kernel_id: str | None) -> None:
    """Remember that ``old`` is now ``new`` (and, with ``kernel_id``, that this kernel runs ``new``)."""
    with _lock:
        if kernel_id:
            _kernel_paths.pop(kernel_id, None)
            _kernel_paths[kernel_id] = new
            while len(_kernel_paths) > MAX_KERNELS:
                _kernel_paths.pop(next(iter(_kernel_paths)))
        _moved.pop(new, None)  # a notebook moved back: its old name is its own again
        if old != new:
            _moved[old] = new
            while len(_moved) > MAX_KERNELS:
                _moved.pop(next(iter(_moved)))


def forget_renames() -> None:
    """Forget every rename (a new server; tests)."""
    with _lock:
        _kernel_paths.clear()
        _moved.clear()


def current_notebook(notebook: str | None, kernel_id: Any = None) -> str | None:
    """The path now of the notebook a job message names (``notebook``, as the server names it) from ``kernel_id``.

    A kernel whose session was renamed names its notebook by the new path; a
    message without a kernel id follows the renames of its path.  A message from
    another kernel keeps its path (a new ``Untitled.ipynb`` is not the renamed one).
    """
    with _lock:
        if isinstance(kernel_id, str) and kernel_id in _kernel_paths:
            return _kernel_paths[kernel_id]
        if kernel_id or notebook is None:
            return notebook
        seen = {notebook}
        while notebook in _moved and _moved[notebook] not in seen:  # renamed twice: its newest name
            notebook = _moved[notebook]
            seen.add(notebook)
        return notebook


def rekey_jobs(jobs: Iterable[dict[str, Any]], old: str, new: str, name_of: Callable[[dict[str, Any]], str]) -> int:
    """Move the jobs of notebook ``old`` to ``new`` in place (their default names too); how many moved."""
    moved = 0
    for job in jobs:
        if job.get("notebook") != old:
            continue
        default_name = job.get("name") == name_of(job)
        job["notebook"] = new
        if default_name:
            job["name"] = name_of(job)
        moved += 1
    return moved


def retitle(title: Any, old: str, new: str) -> Any:
    """A kept cluster's title (``"local-1 · Untitled.ipynb · Dec 02 14:05"``) naming the notebook's new name."""
    if not isinstance(title, str):
        return title
    a, b = os.path.basename(old), os.path.basename(new)
    parts = [b + p[len(a) :] if p == a or p.startswith(a + " +") else p for p in title.split(" · ")]
    return " · ".join(parts)


class NotebookRenames:
    """Re-keys what a :class:`.manager.ClusterManager` holds of a notebook when its session's path changes.

    Parameters
    ----------
    manager : ClusterManager
        Its ``connections`` (running clusters) and ``history`` (stopped ones,
        with ``_disk``: their files) are re-keyed.
    """

    def __init__(self, manager: Any):
        self.manager = manager

    def renamed(self, old: str, new: str, kernel_id: str | None = None) -> int:
        """The session of ``kernel_id`` moved from ``old`` to ``new``: re-key its jobs; how many moved."""
        from .jobs import job_name

        if not old or not new or old == new:
            return 0
        note_rename(old, new, kernel_id)
        m = self.manager
        moved = 0
        for conn in list(m.connections.values()):
            n = rekey_jobs(conn.jobs.jobs.values(), old, new, job_name)
            if n:
                conn.jobs.version += 1
                moved += n
        for kept in list(m.history.values()):
            n = rekey_jobs(kept.jobs.jobs.values(), old, new, job_name)
            if not n:
                continue
            moved += n
            kept.jobs.version += 1
            kept.notebooks = [new if nb == old else nb for nb in kept.notebooks]
            kept._summary["title"] = retitle(kept._summary.get("title"), old, new)
            m._disk.save(kept)  # the kernel's jc.runs() reads the files: they name the new path
        if moved:
            m._history_version += 1
        logger.info("jupyter-cluster: notebook %s is now %s (%d jobs re-keyed)", old, new, moved)
        return moved


def follow_sessions(session_manager: Any, on_rename: Callable[[str, str, str | None], Any]) -> bool:
    """Call ``on_rename(old, new, kernel_id)`` whenever a session's path changes; whether it could be followed.

    jupyter_server has no event for it, so the session manager's
    ``update_session`` (what ``PATCH api/sessions/<id>`` calls) is wrapped on
    this instance: the session's path before and after the update is compared.
    A failure in ``on_rename`` is logged, never raised into the request.
    """
    original = getattr(session_manager, "update_session", None)
    get = getattr(session_manager, "get_session", None)
    if original is None or get is None or getattr(original, "_jupyter_cluster", False):
        return False

    async def update_session(session_id: Any, **kwargs: Any) -> Any:
        before = None
        if "path" in kwargs:
            try:
                before = await get(session_id=session_id)
            except Exception:  # no such session: the original says so
                before = None
        result = await original(session_id, **kwargs)
        if before is not None:
            try:
                after = await get(session_id=session_id)
                old, new = before.get("path"), after.get("path")
                kernel = (after.get("kernel") or {}).get("id")
                if isinstance(old, str) and isinstance(new, str) and old != new:
                    kernel = kernel if isinstance(kernel, str) else None
                    _restart_env(session_manager, kernel, new)
                    on_rename(old, new, kernel)
            except Exception:
                logger.exception("jupyter-cluster: could not follow the rename of session %s", session_id)
        return result

    update_session._jupyter_cluster = True  # type: ignore[attr-defined]
    session_manager.update_session = update_session
    return True


def _restart_env(session_manager: Any, kernel_id: str | None, path: str) -> None:
    """A restarted kernel starts with the new path (jupyter_server joins the session's *name*, which
    JupyterLab changes in a second request; a client that changes only the path would leave the old one)."""
    km = getattr(session_manager, "kernel_manager", None)
    if kernel_id is None or km is None or not hasattr(km, "update_env") or not hasattr(km, "cwd_for_path"):
        return
    full = os.path.join(km.cwd_for_path(path), os.path.basename(path))
    km.update_env(kernel_id=kernel_id, env={"JPY_SESSION_NAME": full})
