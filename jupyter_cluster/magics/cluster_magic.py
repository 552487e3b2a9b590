"""``%cluster``: start, attach to, inspect, scale and stop clusters from a notebook.

The magic only parses its line and calls :mod:`jupyter_cluster.cluster.session`; every
:class:`~jupyter_cluster.errors.ClusterError` becomes a one-sentence
``UsageError`` (no traceback).
"""

from __future__ import annotations

import argparse
import functools
import shlex
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class

from ..errors import CellError, ClusterError, SerializationError
from .args import MagicArgumentParser
from .lazy import LazyModule

if TYPE_CHECKING:
    from ..cluster import session
else:  # imports distributed: on the first %cluster, not at %load_ext
    session = LazyModule("jupyter_cluster.cluster.session")


class _ArgumentParser(MagicArgumentParser):
    magic = "%cluster"


def _formatter(prog: str) -> argparse.HelpFormatter:
    # a fixed width: the usage text must not depend on the terminal the kernel was started from
    return argparse.HelpFormatter(prog, width=100)


def _parser() -> _ArgumentParser:
    """The ``%cluster`` parser: every sub-command, its options and its one-line description."""
    p = _ArgumentParser(prog="%cluster", add_help=False)
    sub = p.add_subparsers(dest="command", parser_class=_ArgumentParser)

    def command(name: str, description: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, add_help=False, description=description, formatter_class=_formatter)

    command("status", "status of the current cluster (also plain %cluster)")
    s = command("start", "start a cluster; kubernetes takes --image ... --dry-run, local takes --gpus")
    s.add_argument("--backend", metavar="B")
    s.add_argument("--name", metavar="N")
    s.add_argument("--workers", type=int, metavar="W")
    s.add_argument("--threads", type=int, metavar="T")
    s.add_argument("--memory-limit", metavar="M")
    s.add_argument("--port", type=int, metavar="P")
    s.add_argument("--host", metavar="H")
    s.add_argument("--tls", action="store_true", default=None)
    s.add_argument("--no-tls", dest="tls", action="store_false")
    s.add_argument("--no-wait", action="store_true")
    s.add_argument("--keep", action="store_true")  # a host process owns it: it outlives this kernel
    s.add_argument("--idle-timeout", metavar="DURATION")  # --keep: stop after this long with nothing to do
    s.add_argument("--gpus", nargs="?", const=True, default=None, metavar="DEVICES")
    s.add_argument("--image", metavar="I")
    s.add_argument("--namespace", metavar="NS")
    s.add_argument("--worker-cpu", metavar="C")
    s.add_argument("--worker-memory", metavar="M")
    s.add_argument("--worker-gpu", type=int, metavar="G")
    s.add_argument("--env", nargs="+", action="extend", metavar="KEY=VALUE")
    s.add_argument("--adapt-min", type=int, metavar="A")
    s.add_argument("--adapt-max", type=int, metavar="B")
    s.add_argument("--dry-run", action="store_true", default=None)
    # batch queues (slurm, pbs, sge, lsf): see docs/hpc.md
    s.add_argument("--partition", metavar="P")
    s.add_argument("--account", metavar="A")
    s.add_argument("--walltime", metavar="HH:MM:SS")
    s.add_argument("--job-extra", nargs="+", action="extend", metavar="DIRECTIVE")
    s.add_argument("--interface", metavar="IF")
    s.add_argument("--hosts", metavar="A,B,C")  # ssh: the first runs the scheduler
    s.add_argument("--address", metavar="URL")  # gateway: the dask-gateway server (else gateway.address)
    command("connect", "attach to a running scheduler (tcp://host:port) or a listed cluster").add_argument(
        "target", metavar="ADDRESS|NAME"
    )
    command("list", "every live cluster on this machine")
    command("use", "make a cluster held by this kernel the current one").add_argument("name", metavar="NAME")
    command("scale", "ask for N workers").add_argument("n", type=int, metavar="N")
    a = command("adapt", "let the cluster choose its number of workers")
    a.add_argument("--minimum", type=int, default=0, metavar="A")
    a.add_argument("--maximum", type=int, metavar="B")
    command("restart", "restart the workers (clears their memory)").add_argument("name", nargs="?", metavar="NAME")
    command("stop", "stop the current (or named) cluster; detach if it was attached").add_argument(
        "name", nargs="?", metavar="NAME"
    )
    command("jobs", "every detached job of yours: cluster, notebook, cell, state, progress")
    j = command("job", "a detached job's state; --out VAR puts its results in a variable")
    j.add_argument("name", metavar="NAME")
    j.add_argument("--out", metavar="VAR")
    j.add_argument("--cancel", action="store_true")
    j.add_argument("--resume", action="store_true")
    m = command("metrics", "live charts of what tasks report with jupyter_cluster.report()")
    m.add_argument("topic", nargs="?", metavar="TOPIC")
    m.add_argument("-h", "--help", action="store_true", dest="topics_help", help=argparse.SUPPRESS)
    p.usage_text = _usage(sub.choices)
    for sp in sub.choices.values():
        sp.usage_text = p.usage_text
    return p


def _usage(commands: Mapping[str, argparse.ArgumentParser]) -> str:
    """The usage text, written from the parser: each sub-command's synopsis, then what it does."""
    lines = []
    for sp in commands.values():
        # argparse aligns wrapped lines under "usage: "; without that prefix they move 7 columns left
        synopsis = sp.format_usage().removeprefix("usage: ").rstrip().replace("\n" + " " * 7, "\n")
        lines.append(f"{synopsis}\n      {sp.description}")
    return "\n".join(lines) + "\n"


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
    "hosts",
    "address",
    "partition",
    "account",
    "walltime",
    "job_extra",
    "interface",
)


@magics_class
class ClusterMagics(Magics):
    """The ``%cluster`` line magic."""

    @line_magic
    def cluster(self, line: str = ""):
        """Manage Dask clusters for this notebook.

        ::

        """  # replaced below with the parser's usage text so `%cluster?` shows it
        try:
            words = shlex.split(line)
        except ValueError as exc:
            raise UsageError(f"%cluster: {exc}.") from None
        args = _parser().parse_args(words)
        return self._run(lambda: self._dispatch(args))

    cluster.__doc__ = "Manage Dask clusters for this notebook.\n\n" + _parser().usage_text

    @staticmethod
    def _run(fn):
        try:
            return fn()
        except (ClusterError, CellError, SerializationError) as exc:
            raise UsageError(str(exc)) from None

    def _dispatch(self, args: argparse.Namespace):
        cmd = args.command or "status"
        if cmd == "start":
            if args.idle_timeout is not None and not args.keep:
                raise ClusterError("--idle-timeout is for kept clusters; add --keep.")
            start = session.start
            if args.keep:
                from ..detached import kept

                start = functools.partial(kept.start, idle_timeout=args.idle_timeout)
            handle = start(
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
            if args.keep:
                print(
                    f"Started kept cluster {handle.name!r} at {handle.address}: it outlives this kernel; "
                    f"attach from another with %cluster connect {handle.name}, stop it with %cluster stop {handle.name}."
                )
            else:
                print(f"Started cluster {handle.name!r} ({handle.backend}) at {handle.address}")
            return _display_handle(handle)
        if cmd in ("jobs", "job"):
            from .detached_magic import job_command

            return job_command(self.shell, args)
        if cmd == "connect":
            handle = session.connect(args.target)
            print(f"Attached to {handle.address} as {handle.name!r}")
            return _display_handle(handle)
        if cmd == "list":
            _print_list(session.clusters())
            return _print_gateway_list()
        if cmd == "use":
            held = session.connect(args.name) if args.name in {h.name for h in session.handles()} else None
            if held is None:
                raise ClusterError(
                    f"this kernel holds no cluster named {args.name!r}; attach with %cluster connect {args.name}."
                )
            print(f"Current cluster: {held.name!r}")
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
        if cmd == "metrics":
            from ..widgets.metrics import (
                metrics_command,  # deliberately lazy: ipywidgets and the charts load on first use
            )

            return metrics_command(self.shell, ["--help"] if args.topics_help else [args.topic or "default"])
        if cmd == "stop":
            from ..detached import kept

            held = session.current() if args.name is None else None
            target = args.name or (held.name if held is not None else None)
            if target is not None and kept.is_kept(target):
                name = kept.stop(target)
                print(f"Stopped kept cluster {name!r}")
                return None
            name = session.stop(args.name)
            print(f"Stopped cluster {name!r}")
            return None
        # status
        current = session.current()
        if current is None:
            print(
                "No cluster in this kernel. Start one with %cluster start, or attach with %cluster connect ADDRESS|NAME."
            )
            return None
        return _display_handle(current)


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


def _print_gateway_list() -> None:
    """The configured dask-gateway's clusters (``gateway.address``), after this machine's."""
    from ..backends.gateway import configured_address, list_clusters

    address = configured_address()
    if address is None:
        return None
    try:
        rows = list_clusters(address)
    except ClusterError as exc:
        print(f"dask-gateway at {address}: {exc}")
        return None
    print(f"dask-gateway at {address}: " + ("no clusters of yours." if not rows else f"{len(rows)} cluster(s)"))
    for r in rows:
        print(f"{r['name']:<34} {r['status']:<10} {r['address']}")
    return None
