"""%%parallel in a real IPython shell on a real 2-worker cluster."""

from __future__ import annotations

import pytest

from jupyter_cluster import mapping

from ..conftest import wait_for
from ..helpers import assert_ran_on_leases


@pytest.fixture
def run(ip, cluster, capsys):
    """Run a cell; return (result, captured stdout)."""

    def _run(cell):
        capsys.readouterr()
        result = ip.run_cell(cell)
        return result, capsys.readouterr().out

    return _run


def test_header_unpacking_notebook_function_class_and_modules(ip, run):
    ip.run_cell(
        "import math\nscale = 10\ndef f(x):\n    return x * scale\nclass Box:\n    def __init__(self, v):\n        self.v = v\n"
    )
    r, out = run(
        "%%parallel a, b in [(1, 2), (3, 4), (5, 6)] --out res --no-progress\nz = f(a) + b\nBox(math.sqrt(z)).v"
    )
    assert r.error_in_exec is None, out
    assert ip.user_ns["res"] == [pytest.approx(v**0.5) for v in (12, 34, 56)]
    # Names assigned in the cell stay on the worker.
    assert "z" not in ip.user_ns
    job = ip.user_ns["_parallel_job"]
    assert job.done == 3 and job.state == "finished"
    assert_ran_on_leases(job)  # %%parallel itself runs on leases fed over Dask's comm


def test_default_out_and_statement_ending_gives_none(ip, run):
    r, _ = run("%%parallel i in range(4) --no-progress\nj = i + 1")
    assert r.error_in_exec is None
    assert ip.user_ns["_parallel"] == [None] * 4


def test_prints_first_items_and_failing_items_labelled(ip, run):
    r, out = run(
        "%%parallel i in range(20) --errors collect --no-progress\nprint('hello', i)\nif i == 13:\n    raise KeyError(i)\ni"
    )
    assert r.error_in_exec is None
    for i in range(5):
        assert f"[item {i}] hello {i}" in out
    assert "[item 13, failed] hello 13" in out
    assert "[item 19]" not in out
    assert "1 of 20 items failed (items 13)" in out
    job = ip.user_ns["_parallel_job"]
    assert job.outputs[19] == "hello 19\n"
    assert isinstance(ip.user_ns["_parallel"][13], KeyError)


def test_failing_item_raises_with_cell_line_numbers(ip, run, capsys):
    r, out = run("%%parallel i in range(10) --no-progress\ny = 1\nif i == 6:\n    1 / 0\ni")
    assert isinstance(r.error_in_exec, ZeroDivisionError)
    notes = "\n".join(r.error_in_exec.__notes__)
    assert "item 6 (6)" in notes and "line 4" in notes
    # IPython shows the remote frame at the cell's own line 4, with its source.
    assert "----> 4     1 / 0" in out and "item 6 (6) failed" in out


def test_missing_name_is_pythons_name_error_at_the_cell_line(ip, run):
    r, out = run("%%parallel i in range(2) --no-progress\ni + not_defined_anywhere")
    assert isinstance(r.error_in_exec, NameError)
    assert "not_defined_anywhere" in str(r.error_in_exec)
    assert "line 2" in "\n".join(r.error_in_exec.__notes__)


def test_syntax_error_is_clear_and_nothing_is_submitted(ip, run):
    before = mapping.last_job()
    r, out = run("%%parallel i in range(2)\nx = (\ni")
    assert "not valid Python" in str(r.error_in_exec) and "line 2" in str(r.error_in_exec)
    assert mapping.last_job() is before


def test_unpicklable_variable_fails_before_submission(ip, run):
    ip.run_cell("import threading\nguard = threading.Lock()")
    before = mapping.last_job()
    r, _ = run("%%parallel i in range(2)\nwith guard:\n    i")
    msg = str(r.error_in_exec)
    assert "`guard`" in msg and "a lock" in msg and "inside the cell" in msg
    assert mapping.last_job() is before


def test_bad_header_and_options(ip, run):
    r, _ = run("%%parallel range(3)\n1")
    assert "TARGETS in ITERABLE" in str(r.error_in_exec)
    r, _ = run("%%parallel i in range(3) --chunksize zero\n1")
    assert "--chunksize" in str(r.error_in_exec)
    r, _ = run("%%parallel i in range(3) --resources GPU=1\n1")
    assert "GPU=1" in str(r.error_in_exec)


def test_large_captured_array_is_sent_once_per_worker(ip, run, tmp_path):
    # A notebook-defined class counts its unpickling on the workers.
    ip.run_cell(
        f"""
import numpy as np
class Counted:
    def __init__(self, arr):
        self.arr = arr
    def __reduce__(self):
        return (_rebuild, (self.arr,))
def _rebuild(arr):
    with open({str(tmp_path / "loads.txt")!r}, 'a') as fh:
        fh.write('x\\n')
    return Counted(arr)
big = Counted(np.ones(500_000))
"""
    )
    r, _ = run("%%parallel i in range(30) --chunksize 1 --no-progress\nfloat(big.arr.sum()) + i")
    assert r.error_in_exec is None
    assert ip.user_ns["_parallel"] == [500_000.0 + i for i in range(30)]
    loads = (tmp_path / "loads.txt").read_text().split()
    # Once per worker (2); a replica racing a task's own fetch may add one per worker.
    assert 1 <= len(loads) <= 4, f"a 4 MB value was unpickled {len(loads)} times for 30 tasks"


def test_all_workers_namespace_persists_and_wins(ip, run, cluster):
    ip.run_cell("setup_value = 'notebook'")
    r, _ = run("%%parallel --all-workers --no-progress\nimport os\nsetup_value = f'worker {os.getpid()}'\nos.getpid()")
    assert r.error_in_exec is None
    pids = ip.user_ns["_parallel"]
    assert len(pids) == 2 and set(pids) == set(cluster.client.scheduler_info()["workers"])
    r, _ = run("%%parallel i in range(6) --no-progress\nsetup_value")
    assert r.error_in_exec is None
    assert all(v.startswith("worker ") for v in ip.user_ns["_parallel"])
    assert {int(v.split()[1]) for v in ip.user_ns["_parallel"]} <= set(pids.values())


def test_all_workers_labels_output_by_worker(ip, run, cluster):
    r, out = run("%%parallel --all-workers --no-progress\nprint('ready')")
    assert r.error_in_exec is None
    workers = sorted(cluster.client.scheduler_info()["workers"])
    for address in workers:
        assert f"[worker {address}] ready" in out
    assert ip.user_ns["_parallel_job"].pinned == workers


def _where(address):
    from distributed import get_worker

    return address, get_worker().address


def test_run_on_workers_runs_once_on_each_worker(cluster):
    job = mapping.run_on_workers(_where, client=cluster)
    assert job.pinned == sorted(cluster.client.scheduler_info()["workers"])
    # Position i of the results ran on worker job.pinned[i], and on no other.
    assert [job.results[i] for i in range(len(job.pinned))] == [(w, w) for w in job.pinned]


def test_every_worker_path_refuses_a_cluster_without_workers(ip, cluster):
    import jupyter_cluster as jc
    from jupyter_cluster.errors import ClusterError

    empty = jc.start(workers=1, name="no-workers-t")  # a cluster starts with workers (issue 25.6): retire them
    empty.scale(0)
    wait_for(lambda: not empty.client.scheduler_info()["workers"], 60, message="the workers to retire")
    try:
        with pytest.raises(ClusterError, match="no workers yet"):
            mapping.run_on_workers(_where, client=empty)
        r = ip.run_cell("%%parallel --all-workers --no-progress\n1")
        assert "no workers yet" in str(r.error_in_exec)  # shown as a one-line UsageError
    finally:
        empty.close()
        jc.connect(cluster.name)  # the module's cluster is current again


def test_unordered_retries_and_timeout_options(ip, run, tmp_path):
    marker = tmp_path / "once"
    r, _ = run(
        f"%%parallel i in range(4) --retries 1 --unordered --no-progress\nimport os\n"
        f"if i == 2 and not os.path.exists({str(marker)!r}):\n    open({str(marker)!r}, 'w').close()\n    raise RuntimeError('flaky')\ni"
    )
    assert r.error_in_exec is None
    assert sorted(ip.user_ns["_parallel"]) == [0, 1, 2, 3]
    r, _ = run("%%parallel i in range(3) --timeout 0.5 --errors collect --no-progress\nwhile i == 1:\n    pass\ni")
    assert isinstance(ip.user_ns["_parallel"][1], TimeoutError)
