"""What the anywidget-based widgets (metric charts, the sweep table) share.

Each widget class is built on first use, not at import: ``anywidget`` and
``traitlets`` stay unimported until a widget is shown, and a checkout whose
JavaScript bundle is not built says so (the caller falls back to text).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


def built_once(cached: Any, bundle: Path, missing: str, build: Callable[[], type]) -> type:
    """The widget class: ``cached`` when already built, else what ``build()`` makes (named after its module).

    Raises
    ------
    FileNotFoundError
        With ``missing`` (what to build) when the JS bundle ``bundle`` is not there.
    """
    if cached is not None:
        return cached
    if not bundle.is_file():
        raise FileNotFoundError(missing)
    cls = build()
    cls.__module__ = build.__module__
    return cls
