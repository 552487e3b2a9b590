"""Scripts: worker processes import the main module, which must not start a cluster again."""

from __future__ import annotations

import os
import sys
import types
from typing import Any

from ...errors import ClusterError

# -- scripts: worker processes import the main module ------------------------------------
GUARD_FIX = 'put the code that starts it under `if __name__ == "__main__":`'


def main_imported_by_workers() -> str | None:
    """The script (or module) each new worker process imports as ``__mp_main__``; None if none.

    A spawned worker re-imports the parent's main module, as
    :mod:`multiprocessing.spawn` decides: a file script or a ``python -m``
    module, but not ``python -c``, stdin, a package's ``__main__`` or IPython.
    (Workers forked from this process's fork server skip it:
    :func:`.forkserver._workers_skip_main`; the guard is asked for all the
    same, so that a script runs alike with either start method.)
    """
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name is not None:
        if name == "__main__" or name.endswith(".__main__"):
            return None
        return getattr(main, "__file__", None) or name
    path = getattr(main, "__file__", None)
    if path is None or os.path.splitext(os.path.basename(path))[0] == "ipython":
        return None
    return os.path.abspath(path)


#: what a test on ``__name__`` tells of the script: true only when run as the main script, or true
#: whenever it is imported (as the workers do, under the name "__mp_main__")
_MAIN, _IMPORTED = "main", "imported"


def _main_test(test: Any) -> str | None:
    """Whether ``test`` holds only in the main script (``_MAIN``), whenever imported (``_IMPORTED``), or neither.

    Knows the forms users write: ``__name__ == "__main__"`` either way round,
    ``!=``, ``in`` / ``not in`` a literal tuple, list or set, ``not``, and
    ``and`` / ``or`` of such tests with anything else.
    """
    import ast

    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _main_test(test.operand)
        return {_MAIN: _IMPORTED, _IMPORTED: _MAIN}.get(inner) if inner else None
    if isinstance(test, ast.BoolOp):
        kinds = [_main_test(value) for value in test.values]
        # `and`: one main-only operand makes it main-only; `or`: one always-true-when-imported does
        one, every = (_MAIN, _IMPORTED) if isinstance(test.op, ast.And) else (_IMPORTED, _MAIN)
        if one in kinds:
            return one
        return every if all(k == every for k in kinds) else None
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return None
    left, right, op = test.left, test.comparators[0], test.ops[0]
    if isinstance(op, (ast.Eq, ast.NotEq)):
        sides = [left, right]
        if not (
            any(isinstance(x, ast.Name) and x.id == "__name__" for x in sides)
            and any(isinstance(x, ast.Constant) and x.value == "__main__" for x in sides)
        ):
            return None
        return _MAIN if isinstance(op, ast.Eq) else _IMPORTED
    if isinstance(op, (ast.In, ast.NotIn)) and isinstance(left, ast.Name) and left.id == "__name__":
        if not isinstance(right, (ast.Tuple, ast.List, ast.Set)):
            return None
        values = {x.value for x in right.elts if isinstance(x, ast.Constant)}
        if len(values) != len(right.elts) or "__main__" not in values or "__mp_main__" in values:
            return None
        return _MAIN if isinstance(op, ast.In) else _IMPORTED
    return None


def _lines(nodes: list[Any]) -> tuple[int, int]:
    return nodes[0].lineno, nodes[-1].end_lineno or nodes[-1].lineno


def _ends_import(body: list[Any]) -> bool:
    """Whether a block ends by leaving the module: ``raise``, ``sys.exit()``, ``exit()``, ``quit()``, ``os._exit()``."""
    import ast

    last = body[-1]
    if isinstance(last, ast.Raise):
        return True
    call = last.value if isinstance(last, ast.Expr) else None
    if not isinstance(call, ast.Call):
        return False
    func = call.func
    if isinstance(func, ast.Name):
        return func.id in ("exit", "quit")
    return (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and (func.value.id, func.attr) in (("sys", "exit"), ("os", "_exit"))
    )


def _script_guards(path: str) -> tuple[list[tuple[int, int]], list[int]] | None:
    """What of a script runs only as the main script, and where its import ends; None if unreadable.

    Returns the line ranges that run only when the script is the main one (the
    body of ``if __name__ == "__main__":`` and of its other forms, the
    ``else:`` of ``if __name__ != "__main__":``, what follows a main-only test
    in an ``and``, a ``match __name__: case "__main__":``) and the lines, run
    at import, that end an import of the script (``if __name__ != "__main__":
    sys.exit()``): the workers, which import it, would end there.
    """
    import ast
    import tokenize

    try:
        with tokenize.open(path) as f:
            source = f.read()
    except (OSError, SyntaxError, ValueError):
        return None
    tree = None
    for _ in range(3):
        try:
            tree = ast.parse(source, path)
            break
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None
        except SystemError:
            # CPython 3.11 keeps ast.parse's recursion count per interpreter, so a parse in another
            # thread at the same moment can fail this one ("AST constructor recursion depth
            # mismatch", seen once when starting 16 workers); it is not about the script: try again.
            continue
    if tree is None:
        return None  # cannot tell: the check never blocks a script it could not read
    guarded: list[tuple[int, int]] = []
    ends: list[int] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.IfExp)):
            kind = _main_test(node.test)
            branch = node.body if kind == _MAIN else node.orelse if kind == _IMPORTED else None
            if branch:
                guarded.append(_lines(branch if isinstance(branch, list) else [branch]))
        elif isinstance(node, ast.BoolOp):
            stop = _MAIN if isinstance(node.op, ast.And) else _IMPORTED  # where evaluation stops in a worker
            kinds = [_main_test(value) for value in node.values]
            if stop in kinds[:-1]:
                guarded.append(_lines(node.values[kinds.index(stop) + 1 :]))
        elif isinstance(node, ast.Match) and isinstance(node.subject, ast.Name) and node.subject.id == "__name__":
            for case in node.cases:
                pattern = case.pattern
                if isinstance(pattern, ast.MatchValue) and getattr(pattern.value, "value", None) == "__main__":
                    guarded.append(_lines(case.body))

    def at_import(block: list[Any]) -> None:
        # statements that run when the module is imported: not those in a function's body
        for stmt in block:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if isinstance(stmt, ast.If):
                kind = _main_test(stmt.test)
                # the branch a worker's import takes, whatever else holds
                branch = stmt.body if kind == _IMPORTED else stmt.orelse if kind == _MAIN else []
                if branch and _ends_import(branch):
                    ends.append(branch[-1].lineno)
            for child in ast.iter_child_nodes(stmt):
                if isinstance(child, (ast.ExceptHandler, ast.match_case)):
                    at_import(child.body)
            for name in ("body", "orelse", "finalbody"):
                inner = getattr(stmt, name, None)
                if isinstance(inner, list):
                    at_import(inner)

    at_import(tree.body)
    ends = [n for n in ends if not any(first <= n <= last for first, last in guarded)]
    return guarded, ends


def check_main_guard(processes: bool | None) -> None:
    """Refuse to start worker processes from a main script's unguarded top-level code.

    Each worker imports the script (see :func:`main_imported_by_workers`), so
    code at its top level that starts a cluster would start one in every
    worker, which multiprocessing refuses with pages of tracebacks.  In such a
    worker (still importing it: multiprocessing's ``_inheriting``) this exits
    the process with one line on stderr; in the script's own process it
    raises :class:`ClusterError` before anything starts, when the call comes
    from a top-level line outside an ``if __name__ == "__main__":`` block (or
    another form of it, see :func:`_script_guards`), or when the script ends
    its own import by the workers (``if __name__ != "__main__": sys.exit()``).
    """
    if processes is False:
        return
    import multiprocessing

    if getattr(multiprocessing.current_process(), "_inheriting", False):
        # One line per worker, not a traceback each: they would bury the script's own error.
        sys.stderr.write(
            f"jupyter_cluster: a worker process imported the main script, which starts a cluster; {GUARD_FIX}.\n"
        )
        sys.stderr.flush()
        raise SystemExit(1)
    main = sys.modules.get("__main__")
    if main is None:
        return
    path = getattr(main, "__file__", None)
    if path is not None and getattr(main, "__spec__", None) is None:
        from multiprocessing import process

        if not os.path.isfile(os.path.join(getattr(process, "ORIGINAL_DIR", None) or "", path)):
            # `python - < script.py` names its main "<stdin>", which multiprocessing would make
            # every worker run as a file and fail to find; without a name they import nothing.
            del main.__file__
    script = main_imported_by_workers()
    path = getattr(main, "__file__", None)
    if script is None or path is None:
        return
    path = os.path.abspath(path)
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None and not (
        frame.f_code.co_name == "<module>"
        and frame.f_globals is vars(main)
        and os.path.abspath(frame.f_code.co_filename) == path
    ):
        frame = frame.f_back
    if frame is None:  # not called from the script's top level (from a thread, say): the workers report it
        return
    found = _script_guards(path)
    if found is None:
        return
    guarded, ends = found
    if ends:  # the workers' import of the script ends there, before any of them can start
        raise ClusterError(
            f"the worker processes import this script ({script}) and line {ends[0]} ends that import "
            f"(it exits when the script is not the main one), so no worker can start; instead, {GUARD_FIX}."
        )
    if any(first <= frame.f_lineno <= last for first, last in guarded):
        return
    raise ClusterError(
        f"the worker processes import this script ({script}) and line {frame.f_lineno} starts a cluster "
        f"when it is imported; {GUARD_FIX}."
    )
