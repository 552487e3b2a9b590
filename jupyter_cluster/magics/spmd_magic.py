"""``%%spmd``: run a cell once on each of N workers, as the ranks of a torch.distributed group.

::

    %%spmd --workers 2
    import torch, torch.distributed as dist
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)                 # rank, world_size are bound; the group is ready
    print(t.item())                    # shown as [rank 0] 3.0

The magic only translates: it parses the options, finds the cell's free names
(:mod:`~jupyter_cluster.cell.capture`), wraps the body in a
:class:`~jupyter_cluster.cell.function.CellFunction` and calls
:func:`jupyter_cluster.collective.client.run`.  ``%spmd`` (line) shows the group;
``%spmd reset`` tears it down.
"""

from __future__ import annotations

import argparse
import shlex
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class

from ..cell import capture
from ..cell.function import CellFunction
from ..errors import CellError, ClusterError, SerializationError
from .args import MagicArgumentParser, add_options, options_text
from .lazy import LazyModule
from .tracebacks import remote_renderer

if TYPE_CHECKING:
    from ..cluster import session
    from ..collective import client as spmd
    from ..collective import groups as spmd_groups
else:  # they import distributed: on the first %%spmd, not at %load_ext
    session = LazyModule("jupyter_cluster.cluster.session")
    spmd = LazyModule("jupyter_cluster.collective.client")
    spmd_groups = LazyModule("jupyter_cluster.collective.groups")

#: ``jupyter_cluster.collective.client.BACKENDS``, written out so that the options table needs no import of it
#: (tests/cluster/test_startup.py checks that the two agree)
BACKENDS = ("gloo", "nccl", "auto")

DEFAULT_OUT = "_spmd"
JOB_NAME = "_spmd_job"

#: the options: the parser and the usage text are both written from this table
OPTIONS: list[tuple[str, dict[str, Any], str]] = [
    ("--workers", {"type": int, "metavar": "N"}, "number of ranks (default: every worker)"),
    (
        "--backend",
        {"default": "auto", "choices": BACKENDS, "metavar": "B"},
        "gloo, nccl or auto (default: auto = nccl when every rank has a GPU, else gloo)",
    ),
    (
        "--timeout",
        {"type": float, "metavar": "S"},
        "a collective waiting longer than S seconds for its peers fails (default: 300)",
    ),
    (
        "--out",
        {"default": DEFAULT_OUT, "metavar": "NAME"},
        "{rank: value of the cell's last expression} (default: _spmd)",
    ),
    (
        "--show",
        {"default": "0", "metavar": "WHO"},
        "whose prints appear, labelled [rank r]: 0 (default), all, or ranks like 0,2",
    ),
    ("--no-progress", {"action": "store_true"}, "no progress display"),
]

SPMD_USAGE = """\
%%spmd [options]        run the cell once on each of N workers, as ranks of a torch.distributed group
%spmd                   show the group (ranks, workers, backend)
%spmd reset             tear the group down: process groups destroyed, per-rank state dropped

OPTIONS

In the cell, `rank` and `world_size` are bound and RANK, WORLD_SIZE, LOCAL_RANK and MASTER_ADDR are
set.  Names the cell assigns stay on each rank for the next %%spmd cells (while the group's workers
live).  The run's record (values, outputs, errors, timings) is stored as _spmd_job.
""".replace("OPTIONS\n", options_text(OPTIONS))


class _ArgumentParser(MagicArgumentParser):
    magic = "%%spmd"
    usage_text = SPMD_USAGE


def _parser() -> argparse.ArgumentParser:
    p = _ArgumentParser(prog="%%spmd", add_help=False)
    add_options(p, OPTIONS)
    return p


def parse_show(text: str):
    """``0`` / ``all`` / ``0,2`` / ``none`` -> what :class:`~jupyter_cluster.collective.client.OutputPrinter` takes."""
    text = text.strip().lower()
    if text == "all":
        return "all"
    if text == "none":
        return None
    try:
        ranks = [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        ranks = []
    if not ranks or min(ranks) < 0:
        raise UsageError(f"%%spmd: --show takes a rank, ranks like 0,2, all or none, not {text!r}.")
    return ranks


@magics_class
class SpmdMagics(Magics):
    """The ``%%spmd`` cell magic and the ``%spmd`` line magic."""

    @line_cell_magic
    def spmd(self, line: str = "", cell: str | None = None):
        try:
            if cell is None:
                return self._line(line)
            return self._cell(line, cell)
        except (ClusterError, CellError, SerializationError) as exc:
            raise UsageError(str(exc)) from None
        except KeyboardInterrupt as exc:
            # one line: the frames of the magic and the wait would only bury the notice above (and
            # rendering them took seconds on a busy machine, past the stop button's 2 s)
            if not hasattr(exc, "_render_traceback_"):
                exc._render_traceback_ = lambda: [  # type: ignore[attr-defined]
                    "\x1b[0;31mKeyboardInterrupt\x1b[0m: the %%spmd cell was interrupted; see the line above."
                ]
            raise

    spmd.__doc__ = "Run a cell on every worker as the ranks of a torch.distributed group.\n\n" + SPMD_USAGE

    def _line(self, line: str):
        try:
            words = shlex.split(line)
        except ValueError as exc:
            raise UsageError(f"%spmd: {exc}.") from None
        cmd = words[0] if words else "status"
        if cmd == "reset" and len(words) == 1:
            had = spmd_groups.reset()
            print(
                "%spmd: the group was torn down; the next %%spmd cell builds a new one."
                if had
                else "%spmd: there is no group to reset."
            )
            return
        if cmd == "status" and len(words) <= 1:
            handle = session.current()
            group = spmd_groups.group(handle) if handle is not None else None
            if group is None:
                print("No %%spmd group on the current cluster; the first %%spmd cell builds one.")
                return
            print(f"%%spmd group: {group.world_size} ranks, backend {group.backend}, rendezvous at {group.hosts[0]}")
            for r, name in enumerate(group.names):
                print(f"  rank {r}: worker {name} ({group.workers[r]})")
            return
        raise UsageError(f"%spmd takes `reset` or nothing, not {line.strip()!r}.\n\n{SPMD_USAGE}")

    def _cell_filename(self, line: str, cell: str) -> tuple[str, str]:
        """Register the cell's text under a name IPython shows as ``Cell In[N]``."""
        text = f"%%spmd {line}\n{cell}"
        assert self.shell is not None  # a magic runs inside its shell
        compiler = getattr(self.shell, "compile", None)
        if compiler is None or not hasattr(compiler, "cache"):
            return "<cell>", text
        # IPython 9 has counted the cell before its magics run: the cell's own number is on the result
        result = getattr(getattr(self.shell, "displayhook", None), "exec_result", None)
        number = getattr(result, "execution_count", None)
        number = number if isinstance(number, int) else self.shell.execution_count
        try:
            name = compiler.cache(text, number, raw_code=text + "\n# %%spmd body\n")
        except TypeError:  # older IPython without raw_code
            name = compiler.cache(text, number)
        return name, text

    def _cell(self, line: str, cell: str):
        try:
            words = shlex.split(line)
        except ValueError as exc:
            raise UsageError(f"%%spmd: {exc} in the options.") from None
        args = _parser().parse_args(words)
        if not args.out.isidentifier():
            raise UsageError(f"%%spmd: --out needs a variable name, not {args.out!r}.")
        if args.timeout is not None and args.timeout <= 0:
            raise UsageError("%%spmd: --timeout takes a positive number of seconds.")
        show = parse_show(args.show)
        filename, text = self._cell_filename(line, cell)
        tree = capture.parse_body(cell, filename, first_line=2)
        analysis = capture.analyse(tree, bound={"rank", "world_size"}, filename=filename)
        assert self.shell is not None  # a magic runs inside its shell
        user_ns = self.shell.user_ns

        handle = session.resolve()
        group = spmd_groups.prepare(handle, args.workers, args.backend, notice=print)  # refuses before anything runs
        captured = capture.capture(analysis.free, user_ns, maybe=analysis.maybe, exclude=group.assigned)
        func = CellFunction(
            cell,
            targets=None,
            filename=filename,
            first_line=2,
            cell_text=text,
            modules=captured.modules,
            small=captured.small,
            persistent=True,
        )
        payload = {"kind": "cell", "func": func, "large": captured.large}
        job = spmd.run(
            payload,
            handle=handle,
            workers=args.workers,
            backend=args.backend,
            timeout=args.timeout,
            label=f"%%spmd ({group.world_size} ranks)",
            on_output=spmd.OutputPrinter(show),
            notice=print,
            progress=False if args.no_progress else None,
        )
        user_ns[JOB_NAME] = job
        user_ns[args.out] = dict(job.values)
        if job.failed_rank is None:
            job.group.assigned |= set(analysis.assigned)
            return
        rank = job.failed_rank
        error = job.errors.get(rank)
        text_tb, frames = job.tracebacks.get(rank, ("", None))
        worker = job.group.names[rank]
        note = f"%%spmd: rank {rank} (worker {worker}) failed; the other ranks were released; details in {JOB_NAME}."
        if error is None:
            raise CellError(f"rank {rank} (worker {worker}) failed and its exception cannot be sent back:\n{text_tb}")
        if frames:
            error._render_traceback_ = remote_renderer(self.shell, error, frames, note)  # type: ignore[attr-defined]
        raise error


def register(ipython) -> None:
    """Register ``%%spmd`` / ``%spmd`` on ``ipython``."""
    ipython.register_magics(SpmdMagics)
