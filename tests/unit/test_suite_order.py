"""The order ``make test`` hands test modules to its processes (tests/conftest.py's ``LONGEST_FIRST``)."""

from __future__ import annotations

import os

from ..conftest import LONGEST_FIRST, ROOT, _longest_first


def test_the_longest_modules_list_names_existing_modules_once():
    """A module renamed or moved would silently lose its place at the front (and the processes their balance)."""
    missing = [path for path in LONGEST_FIRST if not os.path.isfile(os.path.join(ROOT, path))]
    assert not missing, f"LONGEST_FIRST names modules that do not exist: {missing}"
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)


def test_listed_modules_come_first_then_the_most_tests_and_each_module_keeps_its_order():
    class Item:
        def __init__(self, nodeid: str) -> None:
            self.nodeid = nodeid

    short, many, listed = "tests/unit/test_a.py", "tests/unit/test_b.py", LONGEST_FIRST[1]
    items = [Item(f"{short}::t1"), Item(f"{many}::t1"), Item(f"{many}::t2"), Item(f"{listed}::t1")]
    items += [Item(f"{listed}::t2"), Item(f"{LONGEST_FIRST[0]}::C::t1")]
    _longest_first(items)
    assert [i.nodeid for i in items] == [
        f"{LONGEST_FIRST[0]}::C::t1",
        f"{listed}::t1",
        f"{listed}::t2",
        f"{many}::t1",
        f"{many}::t2",
        f"{short}::t1",
    ]
