"""The process that owns a cluster started from the JupyterLab panel.

``python -m jupyter_cluster.server.host --name N --workers 2`` starts a cluster
with owner kind ``"panel"``, prints one JSON line (``{"ok": true, "name": ...,
"address": ...}`` or ``{"ok": false, "error": ...}``) and then keeps the cluster
alive until it is asked to stop (panel, ``%cluster stop NAME``, SIGTERM), its
scheduler goes away, or it has been idle for ``jupyter-cluster.detached.idle-timeout``
(no running detached job, no attached kernel).

It is a kept cluster's host (:func:`jupyter_cluster.detached.host.serve`), so
the panel's clusters take detached jobs too.  Why a process of its own rather
than the Jupyter server: the cluster belongs to no kernel, so it survives
kernel restarts, and it also survives a restart of the Jupyter server; a busy
scheduler never competes with the server for the GIL.  The server spawns it in
a new session so that Ctrl-C in the server's terminal does not take the cluster
down with it.
"""

from __future__ import annotations

import argparse
import sys


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m jupyter_cluster.server.host", description=__doc__.splitlines()[0])
    p.add_argument("--name")
    p.add_argument("--backend")
    p.add_argument("--workers", type=int)
    p.add_argument("--threads", type=int)
    p.add_argument("--memory-limit")
    p.add_argument("--log", help="file that receives the process's output once it has started")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # after the arguments: a bad command line fails before the notebook side loads
    from ..detached.host import serve

    options = {"workers": args.workers, "threads": args.threads, "memory_limit": args.memory_limit}
    return serve(
        args.name, args.backend, {k: v for k, v in options.items() if v is not None}, None, args.log, owner_kind="panel"
    )


if __name__ == "__main__":
    sys.exit(main())
