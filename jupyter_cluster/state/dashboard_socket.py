"""The kernel side of a local cluster's dashboard on a Unix socket: the socket, its link, its checks.

A TLS local cluster (the default) takes its scheduler's dashboard off TCP onto
a socket in a private folder; the Jupyter server proxies browsers to it behind
its own authentication (:mod:`jupyter_cluster.server.dashboard`).  What both
the kernel (the local backend, the registry's clean-up) and the server need is
here, import-light: no tornado handlers, no jupyter_server.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from typing import Any, TypeGuard

ROUTE = "jupyter-cluster/dashboard"


def link(base_url: str, name: str) -> str:
    """The browser link of cluster ``name``'s dashboard under a server at ``base_url``."""
    return "/" + "/".join(p.strip("/") for p in (base_url, ROUTE, name, "status") if p.strip("/"))


def socket_is_ours(path: Any) -> TypeGuard[str]:
    """Whether ``path`` is a Unix socket of this user in a folder only this user can enter."""
    if not isinstance(path, str) or not os.path.isabs(path):
        return False
    try:
        st = os.lstat(path)
        folder = os.lstat(os.path.dirname(path))
    except OSError:
        return False
    return (
        stat.S_ISSOCK(st.st_mode)
        and st.st_uid == os.getuid()
        and stat.S_ISDIR(folder.st_mode)
        and folder.st_uid == os.getuid()
        and stat.S_IMODE(folder.st_mode) & 0o077 == 0
    )


def dashboard_on_unix_socket(cluster: Any) -> str:
    """Move the scheduler's dashboard from its TCP port to a Unix socket only this user can open.

    A loopback port is open to every user of the machine; a socket in a fresh
    0700 folder is not.  Browsers reach it through the Jupyter server, behind
    its authentication (:mod:`jupyter_cluster.server.dashboard`).  The
    scheduler runs in this process (local clusters), so its HTTP server is
    rebound on its own event loop.  Returns the socket's path.
    """
    from tornado.netutil import bind_unix_socket

    folder = tempfile.mkdtemp(prefix="jupyter-cluster-")  # 0700; short, as socket paths must be (< 108 bytes)
    path = os.path.join(folder, "dashboard.sock")

    async def rebind() -> None:
        server = cluster.scheduler.http_server
        server.stop()
        server.add_socket(bind_unix_socket(path, mode=0o600))

    cluster.sync(rebind)
    return path


def parent_server_base_url() -> str:
    """Base URL of the Jupyter server this kernel runs under ("/" if none; JupyterHub's prefix if set).

    Read from the servers' runtime files (``jpserver-<pid>.json``) without
    importing jupyter_server, whose ``serverapp`` module took 1.2 s of a 2.2 s
    first ``%cluster start``.  A file counts only when its pid is an ancestor
    of this process, which also proves that server still runs.
    """
    import glob
    import json

    import psutil
    from jupyter_core.paths import jupyter_runtime_dir

    try:
        ancestors = {p.pid for p in psutil.Process().parents()}
        files = glob.glob(os.path.join(jupyter_runtime_dir(), "jpserver-*.json"))
    except (OSError, psutil.Error):
        ancestors, files = set(), []
    for path in files:
        try:
            with open(path, encoding="utf-8") as f:
                info = json.load(f)
        except (OSError, ValueError):  # being written, or removed meanwhile
            continue
        if isinstance(info, dict) and info.get("pid") in ancestors:
            return str(info.get("base_url") or "/")
    return os.environ.get("JUPYTERHUB_SERVICE_PREFIX") or "/"


def remove_dashboard_socket(path: str) -> None:
    """Delete the socket at ``path`` and its private folder (no error if they are gone)."""
    with contextlib.suppress(OSError):
        os.remove(path)
    with contextlib.suppress(OSError):
        os.rmdir(os.path.dirname(path))
