"""capture: free names of a cell, and which notebook values can travel (no cluster needed)."""

from __future__ import annotations

import io
import socket
import threading

import numpy as np
import pytest

from jupyter_cluster.cell import capture
from jupyter_cluster.errors import CellError, SerializationError


def free(body, bound=()):
    return capture.analyse(body, bound=bound).free


def test_reads_before_assignment_are_free_and_builtins_are_not_special_cased_here():
    a = capture.analyse("y = x + k\nz = y * 2\nprint(len(z))", bound=["x"])
    assert a.free == ["k", "print", "len"]
    assert a.assigned == {"y", "z"}


def test_assignment_after_read_is_still_free():
    assert free("total = total + 1") == ["total"]
    assert free("n += 1") == ["n"]


def test_imports_functions_classes_bind():
    body = "import numpy as np\nfrom os import path\ndef f(a):\n    return a + g\nclass C(Base):\n    v = w\nnp.sum(path.sep)"
    a = capture.analyse(body)
    assert "np" not in a.free and "path" not in a.free
    # read inside nested scopes (at call time) and at definition time (Base)
    assert {"g", "w", "Base"} <= set(a.free)


def test_comprehension_locals_are_not_free():
    assert free("[i * s for i in items]") == ["items", "s"]


def test_conditional_assignment_is_maybe():
    a = capture.analyse("if flag:\n    v = 1\nprint(v)")
    assert "v" in a.free and "v" in a.maybe
    a = capture.analyse("if flag:\n    v = 1\nelse:\n    v = 2\nv")
    assert "v" not in a.free


def test_loop_target_and_walrus():
    assert free("for j in range(n):\n    acc = j\n(m := 3) + m") == ["range", "n"]


def test_syntax_error_names_the_cell_line():
    with pytest.raises(CellError, match=r"line 3 of the cell is not valid Python"):
        capture.parse_body("x = 1\nx +* 2\n", first_line=2)
    with pytest.raises(CellError, match="magics"):
        capture.parse_body("%time x = 1\n", first_line=2)


def test_capture_sorts_modules_small_large_and_missing():
    big = np.zeros(300_000)  # 2.4 MB
    ns = {"np": np, "k": 3, "big": big, "f": lambda x: x + k_outer, "print": print}
    k_outer = 1  # noqa: F841 - closure for f
    c = capture.capture(["np", "k", "big", "f", "nothere", "print", "len"], ns)
    assert c.modules == {"np": "numpy"}
    assert set(c.small) == {"k", "f"}
    assert set(c.large) == {"big"} and c.sizes["big"] >= 2_400_000
    assert c.missing == ["nothere"]


def test_exclude_skips_names_defined_on_workers():
    c = capture.capture(["model", "k"], {"model": object(), "k": 1}, exclude={"model"})
    assert set(c.small) == {"k"}


@pytest.mark.parametrize(
    "make, kind, advice",
    [
        (lambda tmp: open(tmp / "f.txt", "w"), "an open file", "open it inside the cell"),
        (lambda tmp: threading.Lock(), "a lock", "inside the cell"),
        (lambda tmp: (i for i in range(3)), "a generator", "list"),
        (lambda tmp: socket.socket(), "a socket", "inside the cell"),
    ],
)
def test_unpicklable_value_fails_naming_variable_type_and_fix(tmp_path, make, kind, advice):
    value = make(tmp_path)
    try:
        with pytest.raises(SerializationError) as info:
            capture.capture(["thing"], {"thing": value})
        msg = str(info.value)
        assert "`thing`" in msg and kind in msg and advice in msg
    finally:
        if hasattr(value, "close"):
            value.close()


def test_unpicklable_maybe_name_is_skipped():
    lock = threading.Lock()
    c = capture.capture(["lock"], {"lock": lock}, maybe={"lock"})
    assert not c.small and not c.large


def test_read_mode_file_is_sent_by_content():
    # cloudpickle ships a file opened for reading as its contents; that is fine.
    c = capture.capture(["fh"], {"fh": io.StringIO("abc")})
    assert "fh" in c.small
