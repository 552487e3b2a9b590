"""Whether a ``%%parallel`` cell is a sweep (a table row and a chart series per item) or a plain map.

``%%parallel seed in range(2000)`` or ``%%parallel path in files`` maps a
function over data: its items are not configurations to compare, and a row
and a curve per item buried the sweeps in the runs table (2,000 rows from one
Collatz map).  A sweep is what a researcher writes to compare configurations:
items that are dicts (``%%parallel cfg in grid``), several targets
(``%%parallel lr, mom in product(...)``), or ``--sweep`` asked for.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from numbers import Number
from typing import Any

#: items of a sequence looked at to tell plain values from configurations
LOOK_AT = 64


def _plain(v: Any) -> bool:
    """A number, string, bool or None (a numpy scalar too): data, not a configuration."""
    if v is None or isinstance(v, (str, bytes, bool, Number)):
        return True
    shape = getattr(v, "shape", None)
    return shape is not None and tuple(shape) == () and hasattr(v, "item")


def is_sweep(structure: Any, iterable: Any, asked: bool = False) -> bool:
    """Whether a ``%%parallel`` cell over ``iterable`` (targets as :func:`.tags.target_names` gives) is a sweep.

    Parameters
    ----------
    structure : str, list or None
        The cell's targets: one name, a (nested) list of names, or None when
        they could not be read.
    iterable : iterable
        What the cell maps over; a ``range`` or a sequence is looked at (its
        first :data:`LOOK_AT` items), an iterator is not consumed.
    asked : bool
        ``--sweep``: a sweep whatever its items.
    """
    if asked or isinstance(structure, list):
        return True
    if isinstance(iterable, range):
        return False
    if isinstance(iterable, Mapping):  # iterating a dict gives its keys: plain values
        return not all(_plain(k) for k in itertools.islice(iterable, LOOK_AT))
    if isinstance(iterable, Sequence) or type(iterable).__name__ in ("ndarray", "Series", "Index"):
        try:
            head = [iterable[i] for i in range(min(len(iterable), LOOK_AT))]
        except Exception:  # a sequence that cannot be indexed as promised: as before, a sweep
            return True
        return not all(_plain(v) for v in head)
    # an iterator (a generator, itertools.product, a ParameterGrid-like object we cannot peek): a sweep,
    # as before; --sweep is not needed for it, and a map over a generator of plain values stays cheap
    return True
