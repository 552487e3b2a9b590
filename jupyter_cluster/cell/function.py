"""The cell function: a ``%%parallel`` cell body plus its captured values, ready to send.

:class:`CellFunction` holds the cell's text, targets, the modules to import
and the small captured values (already pickled); it is small and is pickled
once per map.  On a worker it is prepared once per process
(:meth:`jupyter_cluster.engine.worker.run.PreparedCell.of`: compiled, modules
imported, values unpickled) and run item by item by
:func:`jupyter_cluster.engine.worker.run.run_chunk`.  This module imports
nothing of the engine: the worker builds its ``PreparedCell`` itself.

The body is compiled with the notebook's own cell filename and line numbers,
and the cell text is put in the worker's ``linecache``, so remote tracebacks
point at the cell's lines and show their source.
"""

from __future__ import annotations

import ast
import importlib
import linecache
from typing import TYPE_CHECKING, Any

import cloudpickle

if TYPE_CHECKING:
    from ..tracking.tags import ItemTag

ITEM_NAME = "__jc_item__"
RESULT_NAME = "__jc_result__"


class CellFunction:
    """A ``%%parallel`` cell body, ready to be pickled and run per item on workers.

    Parameters
    ----------
    body : str
        The cell body (the lines below ``%%parallel``).
    targets : str or None
        Assignment target source, e.g. ``"lr, depth"``; None for ``--all-workers`` cells.
    filename : str
        Filename the body is compiled under (the notebook's cell name), so
        tracebacks show the cell's lines.
    first_line : int
        Cell line number of the body's first line.
    cell_text : str
        The whole cell, for the worker's ``linecache``.
    modules : dict
        Variable name -> module name, imported by name on the worker.
    small : dict
        Variable name -> pickled value, sent with the function.
    persistent : bool
        Run in the worker's persistent namespace (``--all-workers``): names the
        cell assigns stay there for later cells.
    tag : ItemTag, optional
        The ``%%parallel`` run's tag: the worker runs each item inside it, so
        ``report()`` below the cell says which run and item a value belongs to
        (:func:`jupyter_cluster.telemetry.tags.current_item`).  None: untagged.
    """

    def __init__(
        self,
        body: str,
        targets: str | None = None,
        filename: str = "<cell>",
        first_line: int = 2,
        cell_text: str | None = None,
        modules: dict[str, str] | None = None,
        small: dict[str, bytes] | None = None,
        persistent: bool = False,
        tag: ItemTag | None = None,
    ):
        self.body = body
        self.targets = targets
        self.filename = filename
        self.first_line = first_line
        self.cell_text = cell_text if cell_text is not None else "\n" * (first_line - 1) + body
        self.modules = dict(modules or {})
        self.small = dict(small or {})
        self.persistent = persistent
        self.tag = tag

    def compile(self):
        """Compile the body: bind targets from ``__jc_item__``, keep the last expression's value."""
        tree = ast.parse(self.body, filename=self.filename, mode="exec")
        ast.increment_lineno(tree, self.first_line - 1)
        stmts = list(tree.body)
        if stmts and isinstance(stmts[-1], ast.Expr):
            last = stmts[-1]
            stmts[-1] = ast.copy_location(
                ast.Assign(targets=[ast.Name(RESULT_NAME, ast.Store())], value=last.value), last
            )
        if self.targets is not None:
            target = ast.parse(f"{self.targets} = {ITEM_NAME}", mode="exec").body[0]
            ast.increment_lineno(target, max(self.first_line - 2, 0))
            stmts.insert(0, target)
        tree.body = stmts
        ast.fix_missing_locations(tree)
        return compile(tree, self.filename, "exec", dont_inherit=True)

    def load_values(self) -> dict[str, Any]:
        """Worker side: put the cell's text in linecache, import its modules, unpickle its small values.

        Raises
        ------
        ImportError
            Naming the module the workers lack and the fix.
        """
        lines = self.cell_text.splitlines(True)
        linecache.cache[self.filename] = (len(self.cell_text), None, lines, self.filename)
        values: dict[str, Any] = {}
        for name, modname in self.modules.items():
            try:
                values[name] = importlib.import_module(modname)
            except ImportError as exc:
                raise ImportError(
                    f"module {modname!r} (imported in the notebook as `{name}`) cannot be imported on this worker: {exc}; install it on the workers."
                ) from None
        for name, data in self.small.items():
            values[name] = cloudpickle.loads(data)
        return values
