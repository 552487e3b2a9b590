"""Workers' errors shown at the cell's own lines: tracebacks rebuilt from a worker's frames, one-line interrupts."""

from __future__ import annotations

import types
from collections.abc import Callable
from functools import partial as functools_partial
from typing import Any


def rebuild_traceback(frames: dict, namespace: dict | None = None) -> types.TracebackType | None:
    """A real traceback object from a worker's frames (a tblib dict), for IPython to render.

    Each frame's code object starts at the line where the worker's did
    (``co_firstlineno``, recorded by the worker; 1 for a cell's own module
    code), fails at the worker's line and, for a function, has its name and
    parameters.  tblib's own rebuild starts every code object at the failing
    line, and IPython's renderer in a kernel (which cannot open a cell's file
    and so lists the cell from the code's first line) then put the arrow on
    the ``%%parallel`` line and shifted the lines around it.

    Functions defined in the notebook reach the workers through cloudpickle,
    which renames their file ``<dynamic-code>``; their frames get their
    cell's filename back from the functions in ``namespace``.
    """
    cells: dict | None = None
    top: types.TracebackType | None = None
    last: types.TracebackType | None = None
    node: dict | None = frames
    while node is not None:
        info = dict(node["tb_frame"]["f_code"])
        if info.get("co_filename") == "<dynamic-code>" and namespace is not None:
            if cells is None:
                cells = _code_files(namespace)
            info["co_filename"] = cells.get((info.get("co_name"), info.get("co_firstlineno")), "<dynamic-code>")
        tb = _frame(info, int(node["tb_lineno"]))
        if tb is not None:
            if last is None:
                top = tb
            else:
                last.tb_next = tb
            last = tb
        node = node.get("tb_next")
    return top


def _frame(info: dict, line: int) -> types.TracebackType | None:
    """One traceback entry whose code looks like ``info`` and fails at ``line``."""
    first = info.get("co_firstlineno")
    name = info.get("co_name") or "<module>"
    if not isinstance(first, int) or first < 1 or first > line:
        first = 1 if name == "<module>" else line
    params = info.get("co_params") if name != "<module>" and line > first else None
    names: dict[str, Any] = {"co_filename": info.get("co_filename") or "<unknown>", "co_name": name}
    if hasattr(_frame.__code__, "co_qualname"):
        names["co_qualname"] = info.get("co_qualname") or name
    if params:
        # a function whose def is line `first` and whose raise is `line`, called with placeholders
        args, kwonly = list(params.get("args") or []), list(params.get("kwonly") or [])
        sig = list(args)
        if params.get("varargs"):
            sig.append("*" + params["varargs"])
        elif kwonly:
            sig.append("*")
        sig += kwonly
        if params.get("varkw"):
            sig.append("**" + params["varkw"])
        src = f"def __jc_frame__({', '.join(sig)}):\n" + "\n" * (line - first - 1) + "    raise __traceback_maker\n"
        try:
            scope: dict = {"__traceback_maker": _FrameMaker()}
            exec(compile(src, "<string>", "exec"), scope)
            fn = scope["__jc_frame__"]
            fn.__code__ = fn.__code__.replace(co_firstlineno=first, **names)
            call = lambda: fn(*[None] * len(args), **dict.fromkeys(kwonly))  # noqa: E731
        except (SyntaxError, ValueError, TypeError):
            params = None
    if not params:
        stub = compile("\n" * (line - first) + "raise __traceback_maker", "<string>", "exec")
        code = stub.replace(co_firstlineno=first, **names)
        call = lambda: exec(code, {"__traceback_maker": _FrameMaker(), "__name__": "__main__"})  # noqa: E731
    try:
        call()
    except _FrameMaker as exc:
        tb = exc.__traceback__
        for _ in range(2):  # skip this function's and the lambda's frames
            tb = tb.tb_next if tb is not None else None
        return tb
    return None


def _code_files(namespace: dict) -> dict:
    """``(co_name, co_firstlineno) -> co_filename`` of the notebook's functions and methods."""
    found: dict = {}
    seen: set[int] = set()

    def add_code(code):
        if id(code) in seen:
            return
        seen.add(id(code))
        found.setdefault((code.co_name, code.co_firstlineno), code.co_filename)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                add_code(const)

    def add(obj, depth=0):
        obj = getattr(obj, "__wrapped__", obj)
        if isinstance(obj, (types.FunctionType, types.MethodType)):
            func = getattr(obj, "__func__", obj)
            if getattr(func, "__module__", None) == "__main__":  # what cloudpickle sends by value
                add_code(func.__code__)
        elif isinstance(obj, type) and depth == 0 and getattr(obj, "__module__", None) == "__main__":
            for value in vars(obj).values():
                add(getattr(value, "__func__", value), 1)
        elif isinstance(obj, functools_partial):
            add(obj.func, depth)

    for value in list(namespace.values()):
        try:
            add(value)
        except Exception:  # an odd object in the namespace must not break the traceback
            continue
    return found


class _FrameMaker(Exception):
    """Raised by the stubs that :func:`rebuild_traceback` runs to make frames."""


def execution_count(shell) -> int:
    """The prompt number of the cell being run.

    IPython 9 has already counted the cell when its magics run
    (``shell.execution_count`` is the *next* prompt); the cell's own number
    is on the result being filled.
    """
    result = getattr(getattr(shell, "displayhook", None), "exec_result", None)
    count = getattr(result, "execution_count", None)
    return count if isinstance(count, int) else shell.execution_count


def interrupted_traceback(message: str | None):
    """A ``_render_traceback_``: an interrupted ``%%parallel`` cell shows one line."""
    line = "\x1b[0;31mKeyboardInterrupt\x1b[0m" + (f": {message}" if message else "")
    return lambda: [line]


def set_renderer(exc: BaseException, render: Callable[[], list[str]]) -> None:
    """Give ``exc`` IPython's ``_render_traceback_`` hook: IPython shows ``render()``'s lines instead of a traceback.

    The hook is a plain instance attribute that IPython looks up by name; no
    exception type declares it, so it is put in the instance's ``__dict__``.
    """
    vars(exc)["_render_traceback_"] = render


def remote_renderer(shell, exc: BaseException, frames: dict, note: str):
    """A ``_render_traceback_`` showing remote ``frames`` with the cell's own lines, then ``note``.

    Shared by ``%%parallel`` (a failed item) and ``%%spmd`` (a failed rank).
    """

    def render():
        tb = rebuild_traceback(frames, shell.user_ns)
        notes = getattr(exc, "__notes__", None)
        target: Any = exc  # __notes__ is in typeshed from Python 3.11 only
        try:
            target.__notes__ = [note]
            return shell.InteractiveTB.structured_traceback(type(exc), exc, tb)
        finally:
            if notes is None:
                del target.__notes__
            else:
                target.__notes__ = notes

    return render
