"""A worker's traceback text with the notebook's cells named as IPython names them: ``Cell In[4], line 5``.

The panel lists a failed item's traceback as text.  Its frames name the
kernel's temporary file of the cell (``/tmp/ipykernel_…/….py``; a ``%%parallel``
body is compiled under it), or ``<dynamic-code>`` for a notebook function that
cloudpickle sent by value, where the notebook itself says ``Cell In[4], line 5``.
IPython keeps which cell each such file is (``shell.compile._filename_map``);
a ``<dynamic-code>`` frame is found by its function's name among the
notebook's functions.
"""

from __future__ import annotations

import re
import types
from typing import Any

_FRAME = re.compile(r'File "([^"]+)", line (\d+)(?:, in ([\w<>.]+))?')


def _shell() -> Any:
    try:
        from IPython import get_ipython
    except ImportError:  # no IPython: no cells to name
        return None
    return get_ipython()


def _function_files(namespace: dict[str, Any]) -> dict[str, str]:
    """``co_name -> co_filename`` of the notebook's own functions (the first of a name wins)."""
    out: dict[str, str] = {}
    for value in list(namespace.values()):
        func = getattr(value, "__wrapped__", value)
        if isinstance(func, types.FunctionType) and getattr(func, "__module__", None) == "__main__":
            out.setdefault(func.__code__.co_name, func.__code__.co_filename)
    return out


def cell_names(text: str, shell: Any = None) -> str:
    """``text`` with each frame in a notebook cell written ``Cell In[N], line L`` (others as they were)."""
    shell = shell if shell is not None else _shell()
    cells = getattr(getattr(shell, "compile", None), "_filename_map", None)
    if not text or not isinstance(cells, dict) or not cells:
        return text
    functions: dict[str, str] | None = None

    def name(m: re.Match[str]) -> str:
        nonlocal functions
        path, line, where = m.group(1), m.group(2), m.group(3)
        if path == "<dynamic-code>" and where:
            if functions is None:
                functions = _function_files(getattr(shell, "user_ns", None) or {})
            path = functions.get(where, path)
        n = cells.get(path)
        if not isinstance(n, int):
            return m.group(0)
        return f"Cell In[{n}], line {line}" + (f", in {where}" if where else "")

    try:
        return _FRAME.sub(name, text)
    except Exception:  # naming cells must never lose the traceback
        return text
