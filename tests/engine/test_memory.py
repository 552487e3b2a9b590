"""A finished map holds nothing of its inputs or results once the caller drops them (issue 25, item 2).

Loops of maps that return arrays (evolution strategies, population-based
training) must not grow the kernel: progress observers, ``last_job()``, the
job's record, the lease pool and the error records keep counts, timings and
text, never the values.  Every front end is tried: ``jupyter_cluster.map`` /
``imap`` (both engine paths), ``Pool.map`` / ``imap`` / ``map_async`` and
``%%parallel`` in a real IPython shell.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import time
import weakref

import cloudpickle
import dask
import pytest

import jupyter_cluster as jc
from jupyter_cluster import mapping
from jupyter_cluster.tracking import progress

# Functions and classes defined here travel by value: the workers cannot import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Token:
    """A small result or input that takes weak references (ints and strings do not)."""

    def __init__(self, value):
        self.value = value


def make_token(x):
    return Token(getattr(x, "value", x) * 2)


class BadToken(ValueError):
    """A failure that takes weak references (the builtin exceptions do not)."""


def make_set(x):
    """A result that plain pickle sends back (Pool checks results as multiprocessing does) and that takes weak references."""
    return {getattr(x, "value", x), "result"}


def token_or_fail(x):
    if x.value % 100 == 3:
        raise BadToken(f"bad token {x.value}")
    return Token(x.value)


def _alive(refs: list, grace: float = 5.0) -> int:
    """How many of ``refs`` still live after ``gc.collect()``.

    Another thread may hold a value for a moment (the ticker reading a
    finished job, the client's loop ending the coroutine that carried a
    batch): that is waited out, up to ``grace`` seconds.  What is kept
    (the bug) stays alive however long one waits.
    """
    deadline = time.monotonic() + grace
    while True:
        gc.collect()
        left = sum(r() is not None for r in refs)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def _check_loop(run, maps: int, items: int = 6) -> None:
    """Run ``run(inputs) -> results`` ``maps`` times; after each ``del`` every result and input is gone."""
    for m in range(maps):
        inputs = [Token(m * 100 + k) for k in range(items)]
        results = run(inputs)
        assert len(results) == items
        refs = [weakref.ref(v) for v in results] + [weakref.ref(v) for v in inputs]
        del results, inputs
        left = _alive(refs)
        assert left == 0, f"map {m}: {left} of its {2 * items} results and inputs are still alive after del"


def test_thirty_small_maps_keep_no_result_or_input(cluster):
    _check_loop(lambda xs: jc.map(make_token, xs, client=cluster), maps=30)
    # The record stays: counts and timings of the last map, through last_job() and its observer.
    job = mapping.last_job()
    assert job is not None and job.state == "finished" and job.done == 6 and job.results == {}
    assert progress.recent[-1].model.snapshot()["done"] == 6


def test_collected_failures_keep_only_their_text(cluster):
    def run(xs):
        out = jc.map(token_or_fail, xs, errors="collect", client=cluster)
        assert isinstance(out[3], ValueError)
        return out

    _check_loop(run, maps=5)
    job = mapping.last_job()
    assert job.failed == 1 and list(job.errors) == [3]
    assert "BadToken: bad token 403" in str(job.errors[3])
    assert isinstance(job.failed_items[3][0], str)  # a short repr in place of the item
    assert [f["error"] for f in progress.recent[-1].published[-1]["failures"]] == ["BadToken: bad token 403"]


def test_a_failed_map_is_kept_for_last_job_only_until_the_next_map(cluster):
    inputs = [Token(k) for k in range(6)]
    with pytest.raises(BadToken):
        jc.map(token_or_fail, inputs, chunksize=1, client=cluster)
    job = mapping.last_job()  # documented: a map that failed keeps what it had, for a look afterwards
    assert job.state == "failed" and 3 in job.errors and job.failed_items[3][0] is inputs[3]
    refs = [weakref.ref(job)] + [weakref.ref(v) for v in inputs]
    del job, inputs
    assert [t.value for t in jc.map(make_token, [1], client=cluster)] == [2]  # the next map replaces it
    left = _alive(refs)
    assert left == 0, f"{left} of the failed map's job and inputs outlived the next map"


def test_imap_and_the_task_path_keep_nothing(cluster):
    _check_loop(lambda xs: list(jc.imap(make_token, xs, client=cluster)), maps=5)
    _check_loop(lambda xs: list(jc.imap(make_token, xs, client=cluster, ordered=False)), maps=3)
    with dask.config.set({"jupyter-cluster.engine.path": "tasks"}):
        _check_loop(lambda xs: jc.map(make_token, xs, client=cluster), maps=5)
        assert mapping.last_job().path == "tasks"


def test_pool_map_imap_map_async_and_apply_keep_nothing(cluster):
    with jc.Pool(cluster=cluster, progress=False) as pool:
        _check_loop(lambda xs: pool.map(make_set, xs), maps=5)
        _check_loop(lambda xs: list(pool.imap(make_set, xs)), maps=5)
        _check_loop(lambda xs: list(pool.imap_unordered(make_set, xs)), maps=3)
        _check_loop(lambda xs: pool.map_async(make_set, xs).get(timeout=60), maps=5)
        _check_loop(lambda xs: [pool.apply_async(make_set, (x,)).get(timeout=60) for x in xs], maps=3)


def test_an_abandoned_imap_is_not_kept_alive_by_its_progress(cluster):
    inputs = [Token(k) for k in range(50)]
    it = jc.imap(make_token, inputs, client=cluster, chunksize=1)
    first = next(it)
    obs = progress.recent[-1]
    refs = [weakref.ref(it), weakref.ref(first)] + [weakref.ref(v) for v in inputs]
    del it, first, inputs
    assert _alive(refs) == 0
    assert obs.job is None  # its display now reads cancelled, and no longer refers to the job


def test_parallel_cell_results_live_in_the_out_variable_alone(ip, cluster):
    ip.user_ns["Token"] = Token
    for m in range(5):
        ip.user_ns["inputs"] = [Token(m * 10 + k) for k in range(6)]
        r = ip.run_cell("%%parallel t in inputs --out res --no-progress\nToken(t.value + 1)")
        assert r.error_in_exec is None
        res = ip.user_ns["res"]
        assert [v.value for v in res] == [m * 10 + k + 1 for k in range(6)]
        refs = [weakref.ref(v) for v in res] + [weakref.ref(v) for v in ip.user_ns["inputs"]]
        del res
        ip.run_cell("del res, inputs")
        left = _alive(refs)
        assert left == 0, f"cell {m}: {left} results or inputs still alive after `del res, inputs`"
        job = ip.user_ns["_parallel_job"]
        assert job.state == "finished" and job.done == 6 and job.results == {}


SCRIPT = textwrap.dedent(
    """
    import gc, json, os, sys, time, weakref

    import numpy as np

    import jupyter_cluster as jc

    MAPS, ITEMS, MB = 50, 2, 10  # 50 maps, each returning 10 MB (2 arrays of 5 MB)


    def rss_mb():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


    def make(x):
        import numpy as np

        return np.full(MB * 2**20 // ITEMS, int(x[0]) % 251, dtype=np.uint8)


    if __name__ == "__main__":
        handle = jc.start(workers=2, threads=1)
        r = jc.map(make, [np.array([0])] * ITEMS)  # warm-up: the engine's own allocations happen here
        del r
        gc.collect()
        base = rss_mb()
        peak, alive = base, []
        for m in range(MAPS):
            inputs = [np.array([m * ITEMS + k]) for k in range(ITEMS)]
            r = jc.map(make, inputs)
            assert sum(a.nbytes for a in r) == MB * 2**20
            refs = [weakref.ref(v) for v in r] + [weakref.ref(v) for v in inputs]
            del r, inputs
            # Waits out a value another thread holds for a moment (see _alive in the test module).
            deadline = time.monotonic() + 5.0
            while True:
                gc.collect()
                left = sum(w() is not None for w in refs)
                if not left or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            alive.append(left)
            peak = max(peak, rss_mb())
        print("RESULT " + json.dumps({"base": base, "peak": peak, "end": rss_mb(), "alive": alive}), flush=True)
        handle.close()
    """
)


@pytest.mark.timeout(600)
def test_fifty_maps_of_10_mb_give_their_memory_back(tmp_path):
    """RSS stays bounded over 50 maps of 10 MB results (before the fix: +160 MB, 16 maps' worth kept)."""
    script = tmp_path / "fifty_maps.py"
    script.write_text(SCRIPT)
    # A fixed mmap threshold: glibc's sliding one keeps freed blocks of a few MB in the heap, where
    # RSS would read as allocator noise rather than live memory.
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(1 << 20))
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=540, env=env, cwd=tmp_path
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert proc.returncode == 0 and line is not None, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = json.loads(line[len("RESULT ") :])
    print(f"RSS: base {got['base']:.0f} MB, peak {got['peak']:.0f} MB, end {got['end']:.0f} MB")
    assert got["alive"] == [0] * 50, f"results or inputs alive after del, per map: {got['alive']}"
    # One map's 10 MB is in flight at a time; the bound leaves room for 3 more maps' worth of
    # allocator and Dask buffers, far below the 16 maps' worth (160 MB) that were kept before.
    assert got["peak"] - got["base"] < 40, got
