"""The layers a magic calls, imported on the magic's first run rather than at ``%load_ext``.

``session``, ``mapping`` and ``spmd`` import Dask's distributed (about a second
of a small machine's CPU).  ``%load_ext jupyter_cluster`` begins that import in
a background thread (:mod:`jupyter_cluster._core.background`) while the next cell is
written, so loading the magics must not do it first in the foreground.
"""

from __future__ import annotations

import importlib
from typing import Any


class LazyModule:
    """Stands for the module ``name``: it is imported on the first attribute read, then each read is passed on.

    Parameters
    ----------
    name : str
        The module's full name, e.g. ``"jupyter_cluster.cluster.session"``.
    """

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        # import_module returns sys.modules' entry after the first time: a dict look-up per read
        return getattr(importlib.import_module(self._name), attr)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}>"
