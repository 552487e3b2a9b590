"""``%cluster``: start, attach to, inspect, scale and stop clusters from a notebook.

The magic only parses its line and calls :mod:`jupyter_cluster.session`; every
:class:`~jupyter_cluster.errors.ClusterError` becomes a one-sentence
``UsageError`` (no traceback).
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class

from . import session
from .errors import CellError, ClusterError, SerializationError

CLUSTER_USAGE = """\
%cluster                         status of the current cluster
%cluster start [--backend B] [--name N] [--workers W] [--threads T] [--memory-limit M]
               [--port P] [--host H] [--no-tls] [--gpus [DEVICES]]
               kubernetes: [--image I] [--namespace NS] [--worker-cpu C] [--worker-memory M]
               [--worker-gpu G] [--env KEY=VALUE ...] [--adapt-min A] [--adapt-max B] [--dry-run]
%cluster connect ADDRESS|NAME    attach to a running scheduler (tcp://host:port) or a listed cluster
%cluster list                    every live cluster on this machine
%cluster use NAME                make a cluster held by this kernel the current one
%cluster scale N                 ask for N workers
%cluster adapt [--minimum A] [--maximum B]
%cluster restart                 restart the workers (clears their memory)
%cluster stop [NAME]             stop the current (or named) cluster; detach if it was attached
%cluster metrics [TOPIC]         live charts of what tasks report with jupyter_cluster.report()
"""


class MagicArgumentParser(argparse.ArgumentParser):
    """argparse that raises a ``UsageError`` (with the magic's usage) instead of exiting the kernel.

    Subclasses set :attr:`magic` (e.g. ``"%cluster"``) and :attr:`usage_text`.
    """

    magic = ""
    usage_text = ""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(f"{self.magic}: {message}.\n\n{self.usage_text}")

    def exit(self, status: int = 0, message: str | None = None):  # type: ignore[override]
        raise UsageError(message or self.usage_text)


class _ArgumentParser(MagicArgumentParser):
    magic = "%cluster"
    usage_text = CLUSTER_USAGE


def _parser() -> argparse.ArgumentParser:
    p = _ArgumentParser(prog="%cluster", add_help=False)
    sub = p.add_subparsers(dest="command", parser_class=_ArgumentParser)
    s = sub.add_parser("start", add_help=False)
    s.add_argument("--backend")
    s.add_argument("--name")
    s.add_argument("--workers", type=int)
    s.add_argument("--threads", type=int)
    s.add_argument("--memory-limit")
    s.add_argument("--port", type=int)
    s.add_argument("--host")
    s.add_argument("--tls", action="store_true", default=None)
    s.add_argument("--no-tls", dest="tls", action="store_false")
    s.add_argument("--no-wait", action="store_true")
    s.add_argument("--gpus", nargs="?", const=True, default=None)
    s.add_argument("--image")
    s.add_argument("--namespace")
    s.add_argument("--worker-cpu")
    s.add_argument("--worker-memory")
    s.add_argument("--worker-gpu", type=int)
    s.add_argument("--env", nargs="+", action="extend", metavar="KEY=VALUE")
    s.add_argument("--adapt-min", type=int)
    s.add_argument("--adapt-max", type=int)
    s.add_argument("--dry-run", action="store_true", default=None)
    c = sub.add_parser("connect", add_help=False)
    c.add_argument("target")
    sub.add_parser("list", add_help=False)
    u = sub.add_parser("use", add_help=False)
    u.add_argument("name")
    sc = sub.add_parser("scale", add_help=False)
    sc.add_argument("n", type=int)
    a = sub.add_parser("adapt", add_help=False)
    a.add_argument("--minimum", type=int, default=0)
    a.add_argument("--maximum", type=int)
    r = sub.add_parser("restart", add_help=False)
    r.add_argument("name", nargs="?")
    st = sub.add_parser("stop", add_help=False)
    st.add_argument("name", nargs="?")
    sub.add_parser("status", add_help=False)
    return p


# Backend-specific `start` flags, passed through as options; a backend that
# does not take one refuses it (Backend.check_options).
_BACKEND_FLAGS = (
    "gpus",
    "image",
    "namespace",
    "worker_cpu",
    "worker_memory",
    "worker_gpu",
    "env",
    "adapt_min",
    "adapt_max",
    "dry_run",
)

# Extra sub-commands other modules add (e.g. "metrics"): name -> callable(shell, args list)
EXTRA_COMMANDS: dict[str, Any] = {}


@magics_class
class ClusterMagics(Magics):
    """The ``%cluster`` line magic."""

    @line_magic
    def cluster(self, line: str = ""):
        """Manage Dask clusters for this notebook.

        ::

        """  # replaced below with CLUSTER_USAGE so `%cluster?` shows it
        try:
            words = shlex.split(line)
        except ValueError as exc:
            raise UsageError(f"%cluster: {exc}.") from None
        if words and words[0] in EXTRA_COMMANDS:
            return self._run(lambda: EXTRA_COMMANDS[words[0]](self.shell, words[1:]))
        args = _parser().parse_args(words)
        return self._run(lambda: self._dispatch(args))

    cluster.__doc__ = "Manage Dask clusters for this notebook.\n\n" + CLUSTER_USAGE

    @staticmethod
    def _run(fn):
        try:
            return fn()
        except (ClusterError, CellError, SerializationError) as exc:
            raise UsageError(str(exc)) from None

    def _dispatch(self, args: argparse.Namespace):
        cmd = args.command or "status"
        if cmd == "start":
            handle = session.start(
                name=args.name,
                backend=args.backend,
                wait=not args.no_wait,
                workers=args.workers,
                threads=args.threads,
                memory_limit=args.memory_limit,
                port=args.port,
                host=args.host,
                tls=args.tls,
                **{k: getattr(args, k) for k in _BACKEND_FLAGS},
            )
            if isinstance(handle, str):  # --dry-run: the resources, nothing started
                print(handle, end="")
                return None
            print(f"Started cluster {handle.name!r} ({handle.backend}) at {handle.address}")
            return _display_handle(handle)
        if cmd == "connect":
            handle = session.connect(args.target)
            print(f"Attached to {handle.address} as {handle.name!r}")
            return _display_handle(handle)
        if cmd == "list":
            return _print_list(session.clusters())
        if cmd == "use":
            handle = session.connect(args.name) if args.name in {h.name for h in session.handles()} else None
            if handle is None:
                raise ClusterError(
                    f"this kernel holds no cluster named {args.name!r}; attach with %cluster connect {args.name}."
                )
            print(f"Current cluster: {handle.name!r}")
            return None
        if cmd == "scale":
            handle = session.get()
            handle.scale(args.n)
            print(f"Scaling {handle.name!r} to {args.n} workers")
            return None
        if cmd == "adapt":
            handle = session.get()
            handle.adapt(args.minimum, args.maximum)
            print(
                f"{handle.name!r} now adapts between {args.minimum} and {args.maximum if args.maximum is not None else 'auto'} workers"
            )
            return None
        if cmd == "restart":
            handle = session.get(args.name)
            handle.restart()
            print(f"Restarted the workers of {handle.name!r}")
            return None
        if cmd == "stop":
            name = session.stop(args.name)
            print(f"Stopped cluster {name!r}")
            return None
        # status
        handle = session.current()
        if handle is None:
            print(
                "No cluster in this kernel. Start one with %cluster start, or attach with %cluster connect ADDRESS|NAME."
            )
            return None
        return _display_handle(handle)


def _display_handle(handle: session.ClusterHandle):
    """What the magic returns so the notebook shows the cluster (its rich repr)."""
    return handle


def _print_list(records: list[dict[str, Any]]) -> None:
    if not records:
        print("No live clusters on this machine. Start one with %cluster start.")
        return None
    header = f"{'name':<20} {'backend':<10} {'address':<28} {'owner':<14} dashboard"
    print(header)
    for r in records:
        owner = f"{r['owner_kind']} {r['owner_pid']}" + (" *" if r.get("current") else "")
        print(f"{r['name']:<20} {r['backend']:<10} {r['address']:<28} {owner:<14} {r.get('dashboard_link') or '-'}")
    return None


def register_magics(ipython) -> None:
    """Register every jupyter_cluster magic on ``ipython``."""
    ipython.register_magics(ClusterMagics)
    from .spmd_magic import SpmdMagics

    ipython.register_magics(SpmdMagics)
    try:
        from .parallel_magic import ParallelMagics
    except ImportError:  # %%parallel not built yet
        return
    ipython.register_magics(ParallelMagics)
