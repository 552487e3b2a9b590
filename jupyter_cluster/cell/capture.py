"""Which notebook values a ``%%parallel`` cell needs, and whether they can travel.

:func:`analyse` reads the cell body (with :mod:`ast` for the top level, in
execution order, and :mod:`symtable` for nested functions, classes, lambdas and
comprehensions) and returns its *free names*: the names it reads before it has
surely assigned them.  :func:`capture` takes those names from the notebook
namespace and sorts them into modules (re-imported by name on the worker),
small values (pickled now, sent inline) and large values (sent once per worker
by the map engine).  A value that cannot be pickled fails here, before
anything is submitted, with a sentence naming the variable, its type and the
fix.
"""

from __future__ import annotations

import ast
import builtins
import importlib.util
import io
import pickle
import socket
import symtable
import threading
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from ..errors import CellError, SerializationError

#: Values whose pickled size reaches this many bytes are sent once per worker.
LARGE_VALUE_BYTES = 1_000_000

_BUILTIN_NAMES = frozenset(dir(builtins))
# Names the IPython shell puts in user_ns that a cell never wants shipped.
_SHELL_NAMES = frozenset({"In", "Out", "exit", "quit", "get_ipython", "_ih", "_oh", "_dh"})


@dataclass
class CellAnalysis:
    """What a cell body reads and writes at its top level.

    Attributes
    ----------
    free : list of str
        Names read before they are surely assigned, in first-read order.
    maybe : set of str
        The subset of ``free`` that the cell might already have assigned when it
        reads them (a branch, a loop, a nested function); such a name is sent
        when the notebook has a picklable value for it and skipped otherwise.
    assigned : set of str
        Names the cell binds at its top level (they stay on the worker).
    """

    free: list[str] = field(default_factory=list)
    maybe: set[str] = field(default_factory=set)
    assigned: set[str] = field(default_factory=set)


def target_names(node: ast.AST) -> set[str]:
    """Names bound by an assignment target (``a``, ``a, (b, *c)``)."""
    out: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            out.add(sub.id)
    return out


class _Flow(ast.NodeVisitor):
    """Walk top-level statements in execution order, tracking surely-assigned names."""

    def __init__(self, bound: Iterable[str]):
        self.definite: set[str] = set(bound)
        self.maybe: set[str] = set()
        self.assigned: set[str] = set()
        self.free: dict[str, bool] = {}

    # -- names -----------------------------------------------------------
    def _read(self, name: str) -> None:
        if name not in self.definite:
            if name in self.free:
                self.free[name] = self.free[name] and name in self.maybe
            else:
                self.free[name] = name in self.maybe

    def _bind(self, name: str) -> None:
        self.definite.add(name)
        self.assigned.add(name)

    def _store(self, target: ast.AST) -> None:
        if isinstance(target, ast.Name):
            self._bind(target.id)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                self._store(elt)
        elif isinstance(target, ast.Starred):
            self._store(target.value)
        else:  # attribute / subscript: their base is read
            self.visit(target)

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            self._read(node.id)
        elif isinstance(node.ctx, ast.Store):
            self._bind(node.id)

    # -- branches ----------------------------------------------------------
    def _branch(self, *bodies: list[ast.stmt], exhaustive: bool = False) -> None:
        """Run alternative bodies; only names every body assigns (if one must run) stay definite."""
        before, maybe_before = set(self.definite), set(self.maybe)
        outcomes = []
        for body in bodies:
            self.definite = set(before)
            for stmt in body:
                self.visit(stmt)
            outcomes.append(self.definite)
        new = set().union(*outcomes) - before if outcomes else set()
        surely = set.intersection(*outcomes) if (exhaustive and outcomes) else set(before)
        self.definite = surely | before
        self.maybe = maybe_before | (new - self.definite)

    def visit_If(self, node: ast.If) -> None:
        self.visit(node.test)
        self._branch(node.body, node.orelse, exhaustive=True)

    def visit_For(self, node: ast.For | ast.AsyncFor) -> None:
        self.visit(node.iter)
        self._branch([ast.Assign(targets=[node.target], value=ast.Constant(None)), *node.body])
        self._branch(node.orelse)

    visit_AsyncFor = visit_For

    def visit_While(self, node: ast.While) -> None:
        self.visit(node.test)
        self._branch(node.body)
        self._branch(node.orelse)

    def visit_Try(self, node: ast.Try) -> None:
        self._branch(node.body + node.orelse)
        for handler in node.handlers:
            if handler.type is not None:
                self.visit(handler.type)
            body = list(handler.body)
            if handler.name:
                self.maybe.add(handler.name)
                self.assigned.add(handler.name)
            self._branch(body)
        for stmt in node.finalbody:
            self.visit(stmt)

    visit_TryStar = visit_Try

    def visit_Match(self, node: ast.Match) -> None:
        self.visit(node.subject)
        bodies = []
        for case in node.cases:
            captured = [ast.Name(id=n, ctx=ast.Store()) for n in _pattern_names(case.pattern)]
            pre = [ast.Assign(targets=[t], value=ast.Constant(None)) for t in captured]
            guard = [ast.Expr(case.guard)] if case.guard is not None else []
            bodies.append(pre + guard + case.body)
        self._branch(*bodies)

    # -- statements in evaluation order ---------------------------------------
    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        for target in node.targets:
            self._store(target)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if isinstance(node.target, ast.Name):
            self._read(node.target.id)
            self.visit(node.value)
            self._bind(node.target.id)
        else:
            self.visit(node.target)
            self.visit(node.value)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)
        self.visit(node.annotation)
        if node.value is not None:
            self._store(node.target)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.visit(node.value)
        self._store(node.target)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._bind(alias.asname or alias.name.split(".")[0])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for alias in node.names:
            if alias.name != "*":
                self._bind(alias.asname or alias.name)

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            if not isinstance(target, ast.Name):
                self.visit(target)

    # Nested scopes: only what runs at definition time is read here; their
    # bodies are read at call time and handled through symtable.
    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for dec in node.decorator_list:
            self.visit(dec)
        self._visit_arguments(node.args)
        if node.returns is not None:
            self.visit(node.returns)
        self._bind(node.name)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._visit_arguments(node.args, annotations=False)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for dec in node.decorator_list:
            self.visit(dec)
        for base in node.bases:
            self.visit(base)
        for kw in node.keywords:
            self.visit(kw.value)
        self._bind(node.name)

    def _visit_comp(self, node: ast.AST) -> None:
        # The first iterable is evaluated in the enclosing scope.
        self.visit(node.generators[0].iter)  # type: ignore[attr-defined]

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _visit_comp

    def _visit_arguments(self, args: ast.arguments, annotations: bool = True) -> None:
        for default in [*args.defaults, *[d for d in args.kw_defaults if d is not None]]:
            self.visit(default)
        if annotations:
            for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
                if arg is not None and arg.annotation is not None:
                    self.visit(arg.annotation)


def _pattern_names(pattern: ast.AST) -> list[str]:
    names = []
    for sub in ast.walk(pattern):
        if isinstance(sub, ast.MatchAs) and sub.name:
            names.append(sub.name)
        elif isinstance(sub, ast.MatchStar) and sub.name:
            names.append(sub.name)
        elif isinstance(sub, ast.MatchMapping) and sub.rest:
            names.append(sub.rest)
    return names


def _nested_globals(source: str, filename: str) -> list[str]:
    """Names that nested scopes (functions, classes, lambdas, comprehensions) read as globals."""
    top = symtable.symtable(source, filename, "exec")
    out: dict[str, None] = {}

    def walk(table: symtable.SymbolTable) -> None:
        for child in table.get_children():
            for sym in child.get_symbols():
                if sym.is_referenced() and sym.is_global():
                    out.setdefault(sym.get_name())
            walk(child)

    walk(top)
    return list(out)


def parse_body(body: str, filename: str = "<cell>", first_line: int = 1) -> ast.Module:
    """Parse a cell body, turning a syntax error into a :class:`CellError` that names the cell line.

    Parameters
    ----------
    body : str
        The cell body (without the ``%%parallel`` line).
    filename : str
        Name used in error messages.
    first_line : int
        Cell line number of the body's first line (2 below a ``%%parallel`` line).
    """
    try:
        tree = ast.parse(body, filename=filename, mode="exec")
    except SyntaxError as exc:
        line = (exc.lineno or 1) + first_line - 1
        text = (exc.text or "").rstrip("\n")
        where = f"\n    {text.strip()}" if text.strip() else ""
        hint = ""
        if text.lstrip().startswith(("%", "!")):
            hint = " IPython magics and !commands cannot run on the workers; use plain Python in a %%parallel cell."
        raise CellError(f"line {line} of the cell is not valid Python: {exc.msg}.{hint}{where}") from None
    if first_line != 1:
        ast.increment_lineno(tree, first_line - 1)
    return tree


def analyse(body: str | ast.Module, bound: Iterable[str] = (), filename: str = "<cell>") -> CellAnalysis:
    """Find a cell body's free names (read before surely assigned, not builtins).

    Parameters
    ----------
    body : str or ast.Module
        The cell body, as text or already parsed with :func:`parse_body`.
    bound : iterable of str
        Names bound before the body runs (the ``%%parallel`` targets).
    filename : str
        Name used in syntax error messages.

    Returns
    -------
    CellAnalysis

    Examples
    --------
    >>> a = analyse("y = x + 1\\nz = y * k", bound=["x"])
    >>> a.free, sorted(a.assigned)
    (['k'], ['y', 'z'])
    """
    tree = parse_body(body, filename) if isinstance(body, str) else body
    source = body if isinstance(body, str) else ast.unparse(tree)
    flow = _Flow(bound)
    for stmt in tree.body:
        flow.visit(stmt)
    free = dict(flow.free)
    maybe = {n for n, m in free.items() if m}
    for name in _nested_globals(source, filename):
        if name in free or name in bound:
            continue
        free[name] = name in flow.assigned
        if free[name]:
            maybe.add(name)
    names = [n for n in free if not (n.startswith("__") and n.endswith("__"))]
    return CellAnalysis(free=names, maybe=maybe & set(names), assigned=flow.assigned)


# -- capturing values -----------------------------------------------------------


@dataclass
class Captured:
    """Notebook values a cell needs, sorted by how they travel.

    Attributes
    ----------
    modules : dict
        Variable name -> module name, imported by name on the worker.
    small : dict
        Variable name -> cloudpickle bytes, sent inline with the cell.
    large : dict
        Variable name -> value, sent once per worker by the map engine.
    sizes : dict
        Variable name -> pickled size in bytes (small and large values).
    missing : list of str
        Free names the notebook does not have; reading one on the worker raises
        Python's own ``NameError`` at the cell line.
    """

    modules: dict[str, str] = field(default_factory=dict)
    small: dict[str, bytes] = field(default_factory=dict)
    large: dict[str, Any] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)


def _kind(value: Any) -> str:
    """A few words for a value's type, as a user would say it."""
    if isinstance(value, io.IOBase):
        return "an open file"
    if isinstance(value, socket.socket):
        return "a socket"
    if isinstance(value, types.GeneratorType):
        return "a generator"
    if isinstance(value, (type(threading.Lock()), type(threading.RLock()))):
        return "a lock"
    if isinstance(value, (types.FunctionType, types.MethodType)):
        return "a function"
    tname = type(value).__qualname__
    mod = type(value).__module__
    full = tname if mod in ("builtins", "__main__") else f"{mod}.{tname}"
    return f"a {full}"


def _advice(value: Any) -> str:
    if isinstance(value, io.IOBase):
        return "open it inside the cell instead"
    if isinstance(value, socket.socket):
        return "connect inside the cell instead"
    if isinstance(value, types.GeneratorType):
        return "pass list(...) of it, or create the generator inside the cell"
    if isinstance(value, (type(threading.Lock()), type(threading.RLock()))):
        return "create it inside the cell (or use distributed.Lock for a lock shared by the workers)"
    if isinstance(value, (types.FunctionType, types.MethodType)):
        return "make sure what it refers to can be pickled, or define it inside the cell"
    return "create it inside the cell, or build it once per worker with %%parallel --all-workers"


def unpicklable_error(name: str, value: Any, exc: BaseException) -> SerializationError:
    """The one-sentence error for a variable that cannot be sent to the workers."""
    reason = str(exc).strip().rstrip(".") or type(exc).__name__
    return SerializationError(
        f"variable `{name}` ({_kind(value)}) cannot be sent to the workers ({reason}); {_advice(value)}."
    )


def pickled_size(value: Any) -> tuple[int, bytes | None]:
    """Pickled size of ``value`` and, when it is small, its pickle.

    Large buffers (NumPy arrays, bytes-like) are measured out of band, so
    sizing a 100 MB array does not copy it.
    """
    buffers: list[pickle.PickleBuffer] = []
    head = cloudpickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    size = len(head) + sum(memoryview(b).nbytes for b in buffers)
    if size >= LARGE_VALUE_BYTES:
        return size, None
    return size, (head if not buffers else cloudpickle.dumps(value, protocol=5))


def importable_module(module: types.ModuleType) -> str | None:
    """The name to import ``module`` by on a worker, or None if it is not importable by name."""
    name = getattr(module, "__name__", None)
    if not name or name == "__main__" or getattr(module, "__spec__", None) is None:
        return None
    try:
        return name if importlib.util.find_spec(name) is not None else None
    except (ImportError, ValueError):
        return None


def capture(
    names: Iterable[str],
    namespace: Mapping[str, Any],
    maybe: Iterable[str] = (),
    exclude: Iterable[str] = (),
    large_bytes: int = LARGE_VALUE_BYTES,
) -> Captured:
    """Take the values of ``names`` from ``namespace`` and check they can be sent.

    Parameters
    ----------
    names : iterable of str
        Free names of the cell (see :func:`analyse`).
    namespace : mapping
        The notebook namespace (``shell.user_ns``).
    maybe : iterable of str
        Names the cell may have assigned itself; unpicklable values of these
        are skipped instead of failing.
    exclude : iterable of str
        Names not to send (defined on the workers by ``--all-workers`` cells).
    large_bytes : int
        Pickled size from which a value is sent once per worker.

    Raises
    ------
    SerializationError
        A value cannot be pickled; the message names the variable, its type and the fix.
    """
    maybe, exclude = set(maybe), set(exclude)
    out = Captured()
    for name in names:
        if name in exclude or name in _SHELL_NAMES:
            continue
        if name not in namespace:
            if name not in _BUILTIN_NAMES:
                out.missing.append(name)
            continue
        value = namespace[name]
        if name in _BUILTIN_NAMES and value is getattr(builtins, name, object()):
            continue
        if isinstance(value, types.ModuleType):
            modname = importable_module(value)
            if modname is not None:
                out.modules[name] = modname
                continue
        try:
            size, data = pickled_size(value)
        except Exception as exc:  # pickling can raise nearly anything
            if name in maybe:
                continue
            raise unpicklable_error(name, value, exc) from None
        out.sizes[name] = size
        if data is None or size >= large_bytes:
            out.large[name] = value
        else:
            out.small[name] = data
    return out
