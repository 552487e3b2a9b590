"""engine.job: the map's options are checked at the front door, for every front end, before anything runs."""

from __future__ import annotations

import pytest

from jupyter_cluster import mapping


def test_option_checks_at_the_front_door(cluster):
    """Issue 18.5, 18.7, 18.10: every front end goes through MapJob's checks."""
    import jupyter_cluster as jc

    for bad in (0, -1):
        with pytest.raises(ValueError, match=f"GPU={bad} is not a positive amount"):
            mapping.map(abs, [1], resources={"GPU": bad}, client=cluster)
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds, not nan"):
        mapping.map(abs, [1], timeout=float("nan"), client=cluster)
    with pytest.raises(ValueError, match="longer than"):
        mapping.map(abs, [1], timeout=1e12, client=cluster)
    assert mapping.map(abs, [-1, -2], timeout=float("inf"), client=cluster, progress=False) == [1, 2]
    with pytest.raises(ValueError, match="chunksize 100000000000000000000 is larger"):
        mapping.map(abs, range(3), chunksize=10**20, client=cluster)
    with jc.Pool(cluster=cluster) as pool:
        with pytest.raises(ValueError, match="chunksize 100000000000000000000 is larger"):
            pool.map(abs, range(3), chunksize=10**20)


def test_parallel_magic_rejects_bad_options_in_one_line(ip, cluster):
    """Issue 18.5/18.7/18.10 through %%parallel: a UsageError naming the option, nothing runs."""
    from IPython.core.error import UsageError

    for line, words in [
        ("x in range(3) --resources GPU=0", "GPU=0 is not a positive amount"),
        ("x in range(3) --resources GPU=-1", "GPU=-1 is not a positive amount"),
        ("x in range(3) --timeout nan", "not nan"),
        ("x in range(3) --timeout 1e12", "longer than"),
        ("x in range(3) --chunksize 100000000000000000000", "is larger than any input"),
    ]:
        with pytest.raises(UsageError, match=words):
            ip.run_cell_magic("parallel", line, "x\n")
