"""The process that owns a cluster started from the JupyterLab panel.

``python -m jupyter_cluster.server.host --name N --workers 2`` starts a cluster
through :mod:`jupyter_cluster.cluster.session` with owner kind ``"panel"``, prints one
JSON line (``{"ok": true, "name": ..., "address": ...}`` or
``{"ok": false, "error": ...}``) and then keeps the cluster alive until it is
asked to stop (panel, ``%cluster stop NAME``, SIGTERM) or its scheduler goes
away.

Why a process of its own rather than the Jupyter server: the cluster belongs to
no kernel, so it survives kernel restarts, and it also survives a restart of
the Jupyter server; a busy scheduler never competes with the server for the
GIL.  The server spawns it in a new session so that Ctrl-C in the server's
terminal does not take the cluster down with it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from typing import Any


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m jupyter_cluster.server.host", description=__doc__.splitlines()[0])
    p.add_argument("--name")
    p.add_argument("--backend")
    p.add_argument("--workers", type=int)
    p.add_argument("--threads", type=int)
    p.add_argument("--memory-limit")
    p.add_argument("--log", help="file that receives the process's output once it has started")
    return p


def _announce(payload: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(payload) + "\n")
    sys.stdout.flush()


def _redirect_output(path: str | None) -> None:
    """After the announcement nobody reads our pipes: send output to a log file."""
    target = os.open(path or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(target, 1)
    os.dup2(target, 2)
    os.close(target)


def _scheduler_gone(handle: Any) -> bool:
    scheduler = getattr(handle.cluster, "scheduler", None)
    status = getattr(getattr(scheduler, "status", None), "name", None)
    if status is not None:
        return status in ("closing", "closed", "failed")
    return handle.client.status not in ("running", "connecting", "newly-created")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # after the arguments: a bad command line fails before the notebook side loads
    from ..cluster import session
    from ..cluster.control import listen
    from ..errors import ClusterError

    session.set_owner_kind("panel")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        handle = session.start(
            name=args.name,
            backend=args.backend,
            workers=args.workers,
            threads=args.threads,
            memory_limit=args.memory_limit,
        )
    except ClusterError as exc:
        _announce({"ok": False, "error": str(exc)})
        return 1
    except Exception as exc:  # anything else still has to reach the panel as one message
        _announce({"ok": False, "error": f"the cluster could not start: {type(exc).__name__}: {exc}"})
        return 1
    listen(handle, on_stop=stop.set)
    _announce(
        {
            "ok": True,
            "name": handle.name,
            "address": handle.address,
            "dashboard_link": handle.dashboard_link,
            "pid": os.getpid(),
        }
    )
    _redirect_output(args.log)
    while not stop.wait(0.5):
        if handle.closed or _scheduler_gone(handle):
            break
    if not handle.closed:
        handle.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
