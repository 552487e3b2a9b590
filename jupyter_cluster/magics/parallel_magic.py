"""``%%parallel``: run a notebook cell once per item of an iterable on the cluster.

::

    %%parallel seed in range(1000) --out rewards
    env = make_env(seed)
    run_episode(env, policy)        # the last expression's value is the item's result

The magic only translates: it parses the header and options, finds the cell's
free names (:mod:`~jupyter_cluster.cell.capture`), builds a
:class:`~jupyter_cluster.cell.function.CellFunction` and hands it to the one map
engine (:mod:`~jupyter_cluster.mapping`).  Results land in ``--out NAME``
(default ``_parallel``) in input order; the run's record (counts, outputs,
errors' text, timings) is stored as ``_parallel_job``, with the results only of
a cell that was interrupted or failed (a finished cell's are in ``--out``
alone, so deleting it frees them).  Nothing else in the notebook namespace
changes: names assigned in the cell stay on the worker.
"""

from __future__ import annotations

import argparse
import ast
import functools
import shlex
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.core.magic import Magics, cell_magic, magics_class

from ..cell import capture
from ..cell.function import CellFunction
from ..errors import CellError, ClusterError, SerializationError
from ..tracking.sweep_kind import is_sweep
from ..tracking.tags import ItemTag, ItemTap
from .args import MagicArgumentParser, add_options, options_text
from .lazy import LazyModule
from .tracebacks import (
    execution_count,
    interrupted_traceback,
    remote_renderer,
    set_renderer,
)

if TYPE_CHECKING:
    from .. import mapping
    from ..cluster import session
else:  # both import distributed: on the first %%parallel, not at %load_ext
    mapping = LazyModule("jupyter_cluster.mapping")
    session = LazyModule("jupyter_cluster.cluster.session")

DEFAULT_OUT = "_parallel"
JOB_NAME = "_parallel_job"
#: Printed output of items 0 .. SHOW_OUTPUTS-1 is shown under the cell (failing items' always is).
SHOW_OUTPUTS = 5

#: the options: the parser and the usage text are both written from this table
OPTIONS: list[tuple[str, dict[str, Any], str]] = [
    ("--out", {"default": DEFAULT_OUT, "metavar": "NAME"}, "list of results, in input order (default: _parallel)"),
    (
        "--chunksize",
        {"default": "auto", "metavar": "N|auto"},
        "items per task (default: auto, from measured item durations)",
    ),
    ("--unordered", {"action": "store_true"}, "results in completion order"),
    ("--retries", {"type": int, "default": 0, "metavar": "N"}, "re-run an item that raised, up to N times"),
    ("--timeout", {"type": float, "metavar": "S"}, "an item running longer than S seconds fails with TimeoutError"),
    (
        "--errors",
        {"choices": ("raise", "collect"), "default": "raise", "metavar": "raise|collect"},
        "stop at the first failure (default) or collect exceptions in the results",
    ),
    ("--resources", {"metavar": "GPU=1"}, "run items only on workers with these Dask resources"),
    ("--all-workers", {"action": "store_true"}, "run once per worker; names it assigns stay there for later cells"),
    ("--no-progress", {"action": "store_true"}, "no progress display"),
    (
        "--detach",
        {"metavar": "NAME"},
        "run as detached job NAME on a kept cluster, returning at once (%cluster job NAME --out VAR)",
    ),
    (
        "--sweep",
        {"action": "store_true"},
        "a row and a curve per item, as for dict items (plain numbers or strings are a map otherwise)",
    ),
]

PARALLEL_USAGE = (
    "%%parallel TARGETS in ITERABLE [options]     run the cell once per item, on the cluster\n"
    "%%parallel --all-workers [options]           run the cell once on every worker (setup)\n\n"
    + options_text(OPTIONS)
    + "\nThe run's record (outputs, errors, timings; results if interrupted) is stored as _parallel_job.\n"
)

_FLAG_OPTIONS = {flag for flag, kwargs, _ in OPTIONS if kwargs.get("action") == "store_true"}
_VALUE_OPTIONS = {flag for flag, _, _ in OPTIONS} - _FLAG_OPTIONS

# Scheduler address -> names assigned by --all-workers cells on that cluster.
_worker_names: dict[str, set[str]] = {}


class _ArgumentParser(MagicArgumentParser):
    magic = "%%parallel"
    usage_text = PARALLEL_USAGE


@functools.cache
def _parser() -> argparse.ArgumentParser:
    """The options parser, built once: building it cost ~1 ms of every cell (argparse looks up
    its translations for each option); parse_args leaves the parser unchanged, so one serves all cells."""
    p = _ArgumentParser(prog="%%parallel", add_help=False)
    add_options(p, OPTIONS)
    return p


def _option_start(line: str) -> int:
    """Index of the first ``--name`` outside brackets and strings (len(line) if none)."""
    depth, quote, i = 0, None, 0
    while i < len(line):
        c = line[i]
        if quote:
            if c == "\\":
                i += 2
                continue
            if line.startswith(quote, i):
                i += len(quote)
                quote = None
                continue
        elif c in "'\"":
            quote = line[i : i + 3] if line[i : i + 3] in ("'''", '"""') else c
            i += len(quote)
            continue
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif (
            c == "-"
            and depth == 0
            and line.startswith("--", i)
            and (i == 0 or line[i - 1].isspace())
            and i + 2 < len(line)
            and line[i + 2].isalpha()
        ):
            return i
        i += 1
    return len(line)


def split_line(line: str) -> tuple[str, list[str]]:
    """Split the magic line into the ``TARGETS in ITERABLE`` header and option words.

    Options may come before the header, after it, or both.
    """
    rest = line.strip()
    words: list[str] = []
    # Leading options: consume --flag and --option value words.
    while rest.startswith("--"):
        word, _, tail = rest.partition(" ")
        name = word.split("=", 1)[0]
        words.append(word)
        rest = tail.lstrip()
        if name in _VALUE_OPTIONS and "=" not in word:
            value, _, tail = rest.partition(" ")
            words.append(value)
            rest = tail.lstrip()
        elif name not in _FLAG_OPTIONS:
            break
    cut = _option_start(rest)
    header = rest[:cut].strip()
    try:
        words += shlex.split(rest[cut:])
    except ValueError as exc:
        raise UsageError(f"%%parallel: {exc} in the options.") from None
    return header, words


def parse_header(header: str) -> tuple[str, str, set[str]]:
    """``TARGETS in ITERABLE`` -> (targets source, iterable source, bound names).

    Raises
    ------
    CellError
        The header is not a valid ``for`` header.
    """
    try:
        node = ast.parse(f"for {header}: pass").body[0]
    except SyntaxError:
        node = None
    if not isinstance(node, ast.For):
        raise CellError(
            f"the %%parallel header `{header}` is not `TARGETS in ITERABLE` as in a for statement; "
            "write e.g. `%%parallel seed in range(100)` or `%%parallel lr, depth in grid`."
        )
    src = f"for {header}: pass"
    targets, iterable = _segment(src, node.target), _segment(src, node.iter)
    for sub in ast.walk(node.target):
        if isinstance(sub, (ast.Attribute, ast.Subscript)):
            raise CellError(
                f"the %%parallel targets `{targets}` must be plain names "
                "(tuple unpacking is fine), because they are bound on the workers."
            )
    return targets, iterable, capture.target_names(node.target)


def _segment(src: str, node: ast.AST) -> str:
    """``node``'s text as written in ``src`` (parsed nodes carry their positions; unparsed as a fallback)."""
    text = ast.get_source_segment(src, node)
    return text if text is not None else ast.unparse(node)


def _parse_resources(text: str | None) -> dict[str, float] | None:
    if not text:
        return None
    out = {}
    for part in text.replace(",", " ").split():
        name, sep, value = part.partition("=")
        try:
            out[name] = float(value) if sep else 1.0
        except ValueError:
            raise UsageError(f"%%parallel: --resources takes NAME=NUMBER pairs like GPU=1, not {part!r}.") from None
    return out


def _chunksize(text: str) -> int | str:
    if text == "auto":
        return "auto"
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise UsageError(f"%%parallel: --chunksize takes a positive integer or 'auto', not {text!r}.")
    return n


class _OutputPrinter:
    """Prints the first few items' output and every failing item's output, labelled."""

    def __init__(self, labels: list[str] | None = None):
        self.shown = 0
        self.hidden = 0
        self.labels = labels

    def _label(self, index: int) -> str:
        return self.labels[index] if self.labels is not None else f"item {index}"

    def __call__(self, index: int, text: str, failed: bool) -> None:
        if not text:
            return
        if not failed and index >= SHOW_OUTPUTS:
            self.hidden += 1
            return
        self.shown += 1
        tag = f"[{self._label(index)}{', failed' if failed else ''}] "
        lines = text.rstrip("\n").split("\n")
        print(tag + lines[0])
        for ln in lines[1:]:
            print(" " * len(tag) + ln)


@magics_class
class ParallelMagics(Magics):
    """The ``%%parallel`` cell magic."""

    @cell_magic
    def parallel(self, line: str = "", cell: str = ""):
        try:
            return self._parallel(line, cell)
        except (ClusterError, CellError, SerializationError) as exc:
            raise UsageError(str(exc)) from None
        except KeyboardInterrupt as exc:
            # our frames (magic, map engine, the wait in threading) would only bury what happened
            if not hasattr(exc, "_render_traceback_"):
                set_renderer(exc, interrupted_traceback(None))
            raise

    @property
    def _shell(self) -> InteractiveShell:
        """The shell this magic is registered in (``Magics.shell`` is typed optional)."""
        if self.shell is None:
            raise UsageError("%%parallel runs inside an IPython shell; this magic object is not registered in one.")
        return self.shell

    parallel.__doc__ = "Run a cell once per item of an iterable on the cluster.\n\n" + PARALLEL_USAGE

    def _cell_filename(self, line: str, cell: str) -> tuple[str, str]:
        """Register the cell's text under a name IPython shows as ``Cell In[N]``."""
        text = f"%%parallel {line}\n{cell}"
        compiler = getattr(self.shell, "compile", None)
        if compiler is None or not hasattr(compiler, "cache"):
            return "<cell>", text
        number = execution_count(self.shell)
        try:
            name = compiler.cache(text, number, raw_code=text + "\n# %%parallel body\n")
        except TypeError:  # older IPython without raw_code
            name = compiler.cache(text, number)
        return name, text

    def _parallel(self, line: str, cell: str):
        header, words = split_line(line)
        args = _parser().parse_args(words)
        if not args.out.isidentifier():
            raise UsageError(f"%%parallel: --out needs a variable name, not {args.out!r}.")
        if args.retries < 0 or (args.timeout is not None and args.timeout <= 0):
            raise UsageError("%%parallel: --retries must be 0 or more and --timeout a positive number of seconds.")
        chunksize = _chunksize(args.chunksize)
        resources = _parse_resources(args.resources)
        try:  # the map engine's own checks (shared with Pool and jupyter_cluster.map), before anything runs
            mapping.check_options(
                errors=args.errors, chunksize=chunksize, retries=args.retries, timeout=args.timeout, resources=resources
            )
        except (ValueError, TypeError) as exc:
            raise UsageError(f"%%parallel: {exc}") from None
        targets: str | None = None
        bound: set[str] = set()
        if args.all_workers:
            if header:
                raise CellError(
                    "--all-workers runs the cell once on every worker, so it takes no `TARGETS in ITERABLE`; drop the header."
                )
        else:
            if not header:
                raise CellError(
                    "%%parallel needs `TARGETS in ITERABLE`, e.g. `%%parallel seed in range(100)` (or --all-workers)."
                )
            targets, iter_src, bound = parse_header(header)

        filename, text = self._cell_filename(line, cell)
        tree = capture.parse_body(cell, filename, first_line=2)
        analysis = capture.analyse(tree, bound=bound, filename=filename)
        user_ns = self._shell.user_ns

        if not args.all_workers:
            try:
                iterable = eval(compile(iter_src, "<%%parallel header>", "eval"), user_ns)
            except SyntaxError as exc:
                raise CellError(f"the iterable `{iter_src}` is not valid Python: {exc.msg}.") from None

        if args.detach is not None:
            if args.all_workers:
                raise CellError("--detach runs a sweep over items; --all-workers cannot be detached.")
            from .detached_magic import kept_cluster_for

            handle = kept_cluster_for(args.detach)  # a kept cluster and a free name, before anything starts
        else:
            handle = session.resolve()
        defined_on_workers = _worker_names.get(handle.address, set())
        captured = capture.capture(analysis.free, user_ns, maybe=analysis.maybe, exclude=defined_on_workers)
        tap = None
        if not args.all_workers:  # a sweep: each item's value is its config (jupyter_cluster.tracking.tags)
            tag = ItemTag(uuid.uuid4().hex[:12], targets)
            tag.sweep = is_sweep(tag.structure, iterable, asked=args.sweep)  # a map over plain values is no sweep
            tap = ItemTap(iterable, tag)
            iterable = tap
        func = CellFunction(
            cell,
            targets=targets,
            filename=filename,
            first_line=2,
            cell_text=text,
            modules=captured.modules,
            small=captured.small,
            persistent=args.all_workers,
            # the workers run each item inside its tag (engine.worker.run), so its reports say which item
            tag=tap.tag if tap is not None else None,
        )
        options = dict(
            chunksize=chunksize,
            ordered=not args.unordered,
            retries=args.retries,
            timeout=args.timeout,
            errors=args.errors,
            resources=resources,
            progress=False if args.no_progress else None,
            client=handle,
            shared=captured.large,
        )
        if args.all_workers:
            return self._run_all_workers(func, handle, analysis, args, options)
        if args.detach is not None:
            from .detached_magic import submit_cell

            return submit_cell(
                func, cast(ItemTap, tap), args.detach, header, cell, execution_count(self.shell), options
            )
        printer = _OutputPrinter()
        # The engine takes a callable or a CellFunction (prepared once per worker process, by the
        # worker); imap's annotation names only the first.  Not started: it runs in _drive.
        job = mapping.imap(
            cast(Callable, func),
            iterable,
            label=f"%%parallel {header}",
            on_output=printer,
            retain=True,
            tap=tap,  # the sweep's items and run: what the map's record names (tracking.record)
            **options,
        )
        user_ns[JOB_NAME] = job
        self._drive(job, printer)
        # The results are the notebook's, in --out alone: a `del` of it gives their memory back.
        user_ns[args.out] = job.take_results()
        self._summary(job, printer, args.out)
        return None

    def _run_all_workers(self, func, handle, analysis, args, options):
        printer = _OutputPrinter()
        job = mapping.all_workers_job(func, label="%%parallel --all-workers", on_output=printer, retain=True, **options)
        workers = job.pinned
        printer.labels = [f"worker {w}" for w in workers]
        user_ns = self._shell.user_ns
        user_ns[JOB_NAME] = job
        self._drive(job, printer)
        _worker_names.setdefault(handle.address, set()).update(analysis.assigned)
        values = dict(enumerate(job.take_results()))
        user_ns[args.out] = {w: values.get(i) for i, w in enumerate(workers)}
        self._summary(job, printer, args.out)
        return None

    def _drive(self, job: mapping.MapJob, printer: _OutputPrinter) -> None:
        try:
            job.run()
        except KeyboardInterrupt as exc:
            total = "?" if job.total is None else job.total
            print(
                f"Interrupted: {job.done} of {total} items had finished and the rest were cancelled; "
                f"their results are in {JOB_NAME}.results (a dict index -> result)."
            )
            set_renderer(exc, interrupted_traceback("the %%parallel cell was interrupted; see the line above."))
            raise
        except (ClusterError, CellError, SerializationError):
            raise
        except Exception as exc:
            index = next((i for i, e in job.errors.items() if e is exc), None)
            if index is not None and index in job.tracebacks and job.tracebacks[index][1]:
                item, worker = job.failed_items.get(index, ("?", None))
                where = f" on worker {worker}" if worker else ""
                set_renderer(
                    exc,
                    remote_renderer(
                        self.shell,
                        exc,
                        job.tracebacks[index][1],
                        f"%%parallel: item {index} ({mapping.abbreviate(item)}) failed{where}; details in {JOB_NAME}.",
                    ),
                )
            raise

    @staticmethod
    def _summary(job: mapping.MapJob, printer: _OutputPrinter, out: str) -> None:
        if printer.hidden:
            print(f"({printer.hidden} more items printed output; see {JOB_NAME}.outputs)")
        if job.failed:
            shown = ", ".join(str(i) for i in sorted(job.errors)[:10])
            more = ", ..." if job.failed > 10 else ""
            print(
                f"{job.failed} of {job.total} items failed (items {shown}{more}); their exceptions are in {out} "
                f"(their text and tracebacks in {JOB_NAME}.errors and .tracebacks)."
            )
