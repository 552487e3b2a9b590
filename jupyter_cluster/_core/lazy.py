"""A package's names imported with their modules on first use (PEP 562 module ``__getattr__`` and ``__dir__``).

Standard library only: the package ``__init__`` files that use it are imported
by worker processes and the fork server too.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def attach(package: str, names: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: each of ``names`` imported from its module on first use.

    Parameters
    ----------
    package : str
        The package's ``__name__``.
    names : mapping of str to str
        Public name -> the module that defines it, relative to ``package`` (``".session"``).

    Returns
    -------
    tuple
        The package's ``__getattr__`` and ``__dir__``.

    Examples
    --------
    >>> __getattr__, __dir__ = attach(__name__, {"Pool": ".pool"})  # doctest: +SKIP
    """

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        # the next read is a plain one
        vars(sys.modules[package])[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(names))

    return __getattr__, __dir__
