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
    #: the top parser's: the ``start`` sub-command's parser, and the names of its backends' options
    start_parser: argparse.ArgumentParser
    start_options: list[str]


def _formatter(prog: str) -> argparse.HelpFormatter:
    # a fixed width: the usage text must not depend on the terminal the kernel was started from
    return argparse.HelpFormatter(prog, width=100)


#: where the start synopsis leaves the backends' own flags (``Backend.cli_options``) to ``%cluster start --help``
START_SYNOPSIS_TAIL = " [--OPTION ...]"


def _parser(backend_options: bool = True) -> _ArgumentParser:
    """The ``%cluster`` parser: every sub-command, its options and its one-line description.

    ``start`` takes the flags every registered backend declares
    (:func:`jupyter_cluster.backends.start_options`, which imports the backends);
    without ``backend_options`` (the docstring, written at ``%load_ext``) it has
    the session's own only.  The usage text is the same either way: the start
    synopsis ends in ``[--OPTION ...]``, and ``%cluster start --help`` lists them.
    """
    p = _ArgumentParser(prog="%cluster", add_help=False)
    sub = p.add_subparsers(dest="command", parser_class=_ArgumentParser)

    def command(name: str, description: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, add_help=False, description=description, formatter_class=_formatter)

    command("status", "status of the current cluster (also plain %cluster)")
    s = command("start", "start a cluster; --OPTION: its backend's (%cluster start --help lists them)")
    s.add_argument("--backend", metavar="B", help="the backend (default: jupyter-cluster.backend)")
    s.add_argument("--name", metavar="N", help="the cluster's name (default: BACKEND-n)")
    s.add_argument("--no-wait", action="store_true", help="return before the first worker has connected")
    s.add_argument("--keep", action="store_true", help="a host process owns it: it outlives this kernel")
    s.add_argument("--idle-timeout", metavar="DURATION", help="--keep: stop after this long with nothing to do")
    s.add_argument("-h", "--help", action="store_true", dest="start_help", help=argparse.SUPPRESS)
    session_flags = len(s._actions)
    if backend_options:
        from ..backends import start_options

        group = s.add_argument_group("backend options (the backends that take each)")
        session_names = {a.dest for a in s._actions} | {"wait", "help"}
        for merged in start_options():
            if merged.option.name in session_names:  # another package's backend cannot take the session's flags
                continue
            for flags, kwargs in merged.option.argparse_arguments(merged.help()):
                group.add_argument(*flags, **kwargs)
    p.start_options = [
        a.dest for a in s._actions[session_flags:] if a.option_strings and not a.option_strings[0].startswith("--no-")
    ]
    p.start_parser = s
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
    p.usage_text = _usage(sub.choices, session_flags)
    for sp in sub.choices.values():
        sp.usage_text = p.usage_text
    return p


def _usage(commands: Mapping[str, argparse.ArgumentParser], session_flags: int) -> str:
    """The usage text, written from the parser: each sub-command's synopsis, then what it does.

    ``start`` shows its first ``session_flags`` arguments (the session's) and ``[--OPTION ...]``
    for the backends', so that the text does not depend on which backends are installed.
    """
    lines = []
    for name, sp in commands.items():
        actions = sp._actions[:session_flags] if name == "start" else sp._actions
        formatter = sp._get_formatter()
        formatter.add_usage(sp.usage, actions, sp._mutually_exclusive_groups)
        # argparse aligns wrapped lines under "usage: "; without that prefix they move 7 columns left
        synopsis = formatter.format_help().removeprefix("usage: ").rstrip().replace("\n" + " " * 7, "\n")
        if name == "start":
            synopsis += START_SYNOPSIS_TAIL
        lines.append(f"{synopsis}\n      {sp.description}")
    return "\n".join(lines) + "\n"


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
        # only a start imports the backends for their flags: other lines are checked before any import below
        parser = _parser(backend_options=words[:1] == ["start"])
        args = parser.parse_args(words)
        if args.command == "start" and args.start_help:
            print(parser.start_parser.format_help(), end="")
            return None
        backend_options = (
            {name: getattr(args, name) for name in parser.start_options} if args.command == "start" else {}
        )
        return self._run(lambda: self._dispatch(args, backend_options))

    # written at %load_ext: no backend is imported for it (the usage is the same with them, see _usage)
    cluster.__doc__ = (
        "Manage Dask clusters for this notebook.\n\n"
        + _parser(backend_options=False).usage_text
        + "\n%cluster start --help lists the options of every backend.\n"
    )

    @staticmethod
    def _run(fn):
        try:
            return fn()
        except (ClusterError, CellError, SerializationError) as exc:
            raise UsageError(str(exc)) from None

    def _dispatch(self, args: argparse.Namespace, backend_options: dict[str, Any]):
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
                **backend_options,
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
            return _print_remote_lists()
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


def _print_remote_lists() -> None:
    """The clusters remote services hold for this user (a configured dask-gateway's), after this machine's."""
    from ..backends import backend_classes

    for cls in backend_classes().values():
        remote = cls().list_remote()
        if remote is None:
            continue
        if remote.error is not None:
            print(f"{remote.where}: {remote.error}")
            continue
        rows = remote.clusters
        print(f"{remote.where}: " + ("no clusters of yours." if not rows else f"{len(rows)} cluster(s)"))
        for r in rows:
            print(f"{r['name']:<34} {r['status']:<10} {r['address']}")
    return None
