"""The server's history folder on disk: where it is, its files, reading one safely, and what a kept topic holds.

A leaf (it imports nothing of the package), so that both the server's
:class:`jupyter_cluster.server.history.HistoryFolder`, which writes and trims
the folder, and the kernel's :func:`jupyter_cluster.tracking.runs.runs`, which lists a
notebook's earlier runs from it after a kernel restart, read the same files
the same way.  Nothing read is evaluated: callers check every field.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Collection, Mapping
from typing import Any

#: the folder's name under Jupyter's runtime folder
FOLDER_NAME = "jupyter-cluster-history"
#: the largest history file the server writes (bytes)
MAX_FILE_BYTES = 16_000_000


def history_dir() -> str:
    """``<jupyter runtime dir>/jupyter-cluster-history`` (``JUPYTER_RUNTIME_DIR`` moves it)."""
    from jupyter_core.paths import jupyter_runtime_dir

    return os.path.join(jupyter_runtime_dir(), FOLDER_NAME)


def history_files(folder: str, others: list[str] | None = None) -> list[str]:
    """The paths of the folder's regular ``*.json`` files, oldest (by modification time) first; none if unreadable.

    Looked at without following links and without opening anything: a link, a
    FIFO (whose open would wait for a writer, forever) or a folder named
    ``*.json`` is not a history file; their paths are added to ``others`` when given.
    """
    try:
        names = [n for n in os.listdir(folder) if n.endswith(".json")]
    except OSError:
        return []
    found: list[tuple[float, str]] = []
    for n in names:
        path = os.path.join(folder, n)
        try:
            st = os.lstat(path)
        except OSError:
            continue  # gone meanwhile
        if stat.S_ISREG(st.st_mode):
            found.append((st.st_mtime, path))
        elif others is not None:
            others.append(path)
    return [path for _, path in sorted(found)]


def read_json(path: str, max_bytes: int | None = None, private: bool = False) -> Any:
    """The JSON a regular file holds.

    Parameters
    ----------
    path : str
    max_bytes : int, optional
        Refuse a larger file.
    private : bool
        Refuse anything but a regular file of this user that no one else may
        read or write (mode 0600 or stricter), as the server writes them.  The
        file is opened without following a link and checked on the open file,
        so that what is checked is what is read.

    Raises
    ------
    OSError
        When it cannot be read, or is refused (``PermissionError``): never a
        FIFO or device, which is opened without waiting and refused.
    ValueError
        When it is not JSON (nor UTF-8), or is too large.
    """
    # O_NONBLOCK: a FIFO put in place of the file opens at once (and is refused) instead of waiting for a writer
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | (getattr(os, "O_NOFOLLOW", 0) if private else 0)
    fd = os.open(path, flags)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise PermissionError(f"{path} is not a regular file")
        if private and (st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) & 0o077):
            raise PermissionError(f"{path} is not a regular file of this user with mode 0600")
        if max_bytes is not None and st.st_size > max_bytes:
            raise ValueError(f"{path} is larger than {max_bytes} bytes")
        text = f.read() if max_bytes is None else f.read(max_bytes + 1)
    if max_bytes is not None and len(text) > max_bytes:
        raise ValueError(f"{path} is larger than {max_bytes} bytes")
    return json.loads(text.decode("utf-8"))


def checked_run_items(raw: Any) -> dict[str, dict[str, dict[str, Any]]]:
    """A kept topic's ``runs`` (run -> item key -> summary), those of the shape ``TopicStore.run_items`` gives.

    Others are dropped; values that are not numbers are dropped from ``final`` and ``best``.
    """
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for run, items in (raw or {}).items() if isinstance(raw, dict) else ():
        if not isinstance(items, dict):
            continue
        good = {}
        for key, it in items.items():
            if not isinstance(it, dict) or not all(
                isinstance(it.get(f) or {}, dict) for f in ("config", "final", "best", "curves")
            ):
                continue
            curves = {
                m: pts
                for m, pts in (it.get("curves") or {}).items()
                if isinstance(pts, list) and all(isinstance(p, list) and len(p) == 2 for p in pts)
            }
            good[str(key)] = {
                "config": dict(it.get("config") or {}),
                "final": {m: v for m, v in (it.get("final") or {}).items() if _number(v)},
                "best": {m: v for m, v in (it.get("best") or {}).items() if _number(v)},
                "steps": it.get("steps") if _number(it.get("steps")) and it.get("steps") is not None else None,
                "curves": curves,
            }
        out[str(run)] = good
    return out


def kept_run_items(
    kept: dict[str, dict[str, dict[str, Any]]], runs: Collection[str] | None = None, curves: bool = False
) -> dict[str, dict[str, dict[str, Any]]]:
    """A kept topic's run items as :meth:`jupyter_cluster.telemetry.topic_store.TopicStore.run_items` gives a live topic's.

    Parameters
    ----------
    kept : dict
        What :func:`checked_run_items` made of the topic's ``runs``.
    runs : collection of str, optional
        Only these runs (default: all).
    curves : bool
        With each item's ``"curves"`` (metric -> [step, value] points); without, they are left out.
    """
    return {
        run: {
            key: (dict(it) if curves else {n: x for n, x in it.items() if n != "curves"}) for key, it in items.items()
        }
        for run, items in kept.items()
        if runs is None or run in runs
    }


def series_keys(scalars: Mapping[str, Mapping[str, Any]], vectors: Mapping[str, Mapping[str, Any]]) -> set[str]:
    """Every series key of a topic's scalar and vector values: the series its metric charts draw and colour.

    Of a metrics model (``model["scalars"]``, ``model["vectors"]``), a kept
    topic's, or a live :class:`~jupyter_cluster.telemetry.topic_store.TopicStore`'s
    columns (``store.scalars``, ``store.vectors``): each dict is copied before
    it is read, one step under the GIL, so a store's listener may add to it meanwhile.
    """
    return {k for by in (*list(scalars.values()), *list(vectors.values())) for k in list(by)}


def _number(v: Any) -> bool:
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))


def mtime(path: str) -> float:
    try:
        return os.path.getmtime(path)
    except OSError:
        return 0.0


def size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
