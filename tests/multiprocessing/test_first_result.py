"""A script's first ``Pool`` result (issue 36): what stood between the interpreter's start and it.

A script that imports ``jupyter_cluster.multiprocessing`` at its top level and
runs a ``Pool`` under its ``__main__`` guard: the fork server is a fork of the
script made when the cluster starts (``backends/local/fork_self.py``; it was
a fresh interpreter importing distributed a second time, begun at the import
when a core was idle), the workers forked from it do not run the script again
(each re-ran its top level, importing this package: 0.4-0.7 s of CPU per
worker before it could register), the start makes no key (it imported
``cryptography``, 0.1-0.2 s): the cluster still uses TLS, with this user's
0600 key; the versions lookup is done once for every worker; and no engine
warm-up runs beside the ``Pool``'s first task.  A forked server must still give
its workers what a spawned one gives: Dask's thread settings (numpy's OpenBLAS,
loaded by the script, on one thread) and a random state of their own.  Timing
bounds on a shared 2-core machine would be loose enough to pass either way, so
the test checks what made the time.  Figures: ``benchmarks/mp_dropin.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """\
    import os
    import sys
    import time

    t0 = time.perf_counter()
    print("top level ran", flush=True)
    import numpy.random

    import jupyter_cluster.multiprocessing as mp


    def f(x):
        return x + 1


    def worker_state(_):
        import ctypes

        libs = {line.split()[-1] for line in open("/proc/self/maps") if "openblas" in line}
        threads = []
        for path in libs:
            for name in ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads"):
                if hasattr(ctypes.CDLL(path), name):
                    threads.append(getattr(ctypes.CDLL(path), name)())
        return os.getpid(), os.environ.get("OMP_NUM_THREADS"), threads, numpy.random.random()


    if __name__ == "__main__":
        with mp.Pool(2) as p:
            print("result", p.apply(f, (1,)), flush=True)
            print("first result after", round(time.perf_counter() - t0, 3), file=sys.stderr)
            print("address", p._handle.address)
            print("warm-up thread", p._handle._warm_up)
            preloaded = p._handle.client.run(lambda: "jupyter_cluster.backends.local.preload" in sys.modules)
            print("workers forked after the versions lookup", all(preloaded.values()))
            states = {}
            for a in p._handle.client.scheduler_info()["workers"]:
                states[a] = p._handle.client.submit(worker_state, 0, workers=[a], pure=False).result()
            print("worker settings", sorted({(omp, tuple(threads)) for _, omp, threads, _ in states.values()}))
            print("distinct worker draws", len({draw for *_, draw in states.values()}), "of", len(states))
            from multiprocessing import forkserver

            import psutil

            server = psutil.Process(forkserver._forkserver._forkserver_pid)
            print("server is a fork of the script", server.ppid() == os.getpid() and server.cmdline() == psutil.Process().cmdline())
        print("cryptography imported", "cryptography" in sys.modules)
    """
)


@pytest.mark.timeout(200)
def test_a_scripts_pool_forks_its_server_from_the_script_runs_it_once_and_makes_no_key(tmp_path):
    script = tmp_path / "first_result_script.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for key in (
        "DASK_JUPYTER_CLUSTER__LOCAL__FORKSERVER",
        "DASK_JUPYTER_CLUSTER__LOCAL__FORK_SCRIPT",
        "OMP_NUM_THREADS",
    ):
        env.pop(key, None)
    outputs = []
    for _ in range(2):  # the first run of a fresh user may make the shared key; the second must not
        done = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path
        )
        assert done.returncode == 0, done.stderr[-3000:]
        outputs.append(done.stdout.splitlines())
    lines = outputs[1]
    assert lines.count("top level ran") == 1, lines  # not once more per worker
    assert "result 2" in lines
    assert "server is a fork of the script True" in lines, lines
    assert "warm-up thread None" in lines, lines
    assert "cryptography imported False" in lines
    assert "workers forked after the versions lookup True" in lines
    # Dask's pre-spawn settings, also for the OpenBLAS the script had loaded; numpy's generator reseeded per worker
    assert "worker settings [('1', (1,))]" in lines, lines
    assert "distinct worker draws 2 of 2" in lines, lines
    address = next(line.split()[1] for line in lines if line.startswith("address "))
    assert address.startswith("tls://127.0.0.1:")  # still TLS, still loopback
