"""The task path (engine.tasks): one Dask task per chunk, forced by ``engine.path: tasks`` and taken by itself when the workers cannot be reached.

Real clusters: the module's 2-worker local cluster, and a notebook process in
its own network namespace that reaches the scheduler but not the workers.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid

import cloudpickle
import pytest

from jupyter_cluster import mapping

cloudpickle.register_pickle_by_value(sys.modules[__name__])

# -- the fallback: a notebook that reaches the scheduler but not the workers ----------------------
NOTEBOOK = """
import sys, time
from distributed import Client
from jupyter_cluster import mapping

def square(x):
    return x * x

if __name__ == "__main__":
    client = Client(sys.argv[1], timeout=30)
    client.wait_for_workers(2, timeout=60)
    t0 = time.monotonic()
    out = mapping.map(square, range(50), client=client, progress=False)
    print("RESULT", out == [x * x for x in range(50)], mapping.last_job().path, round(time.monotonic() - t0, 2), flush=True)
    out = mapping.map(square, range(5), client=client, progress=False)
    print("AGAIN", out == [0, 1, 4, 9, 16], mapping.last_job().path, flush=True)
    client.close()
"""


@pytest.mark.netns  # the fallback's swap itself is driven without a network in tests/unit/test_job_loop.py
def test_unreachable_workers_fall_back_to_plain_tasks_with_one_line(tmp_path):
    """Two network namespaces: the cluster's (scheduler on its veth, workers on its loopback) and the notebook's.

    The notebook reaches the scheduler's address only; the workers' addresses
    (127.0.0.1 inside the cluster's namespace) mean nothing from there.
    """
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 to build network namespaces")
    tag = f"jce{os.getpid() % 100000}{uuid.uuid4().hex[:4]}"
    cns, nns = f"{tag}-c", f"{tag}-n"
    created, procs = [], []

    def sh(*args):
        out = subprocess.run(args, capture_output=True, text=True, timeout=30)
        if out.returncode:
            raise RuntimeError(f"{' '.join(args)}: {out.stderr.strip()}")

    try:
        try:
            for ns in (cns, nns):
                sh("ip", "netns", "add", ns)
                created.append(ns)
                sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "-n", cns, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", nns)
            sh("ip", "-n", cns, "addr", "add", "10.124.0.1/24", "dev", "eth0")
            sh("ip", "-n", nns, "addr", "add", "10.124.0.2/24", "dev", "eth0")
            for ns in (cns, nns):
                sh("ip", "-n", ns, "link", "set", "eth0", "up")
        except RuntimeError as exc:
            pytest.skip(f"network namespaces unavailable: {exc}")
        address = "tcp://10.124.0.1:8786"
        quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(subprocess.Popen(
            ["ip", "netns", "exec", cns, sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "10.124.0.1",
             "--port", "8786", "--dashboard-address", "127.0.0.1:0"], **quiet))  # fmt: skip
        for _ in range(2):
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", cns, sys.executable, "-m", "distributed.cli.dask_worker", address, "--nthreads", "1",
                 "--no-nanny", "--no-dashboard", "--host", "127.0.0.1"], **quiet))  # fmt: skip
        script = tmp_path / "notebook.py"
        script.write_text(NOTEBOOK)
        nb = subprocess.run(
            ["ip", "netns", "exec", nns, sys.executable, str(script), address],
            capture_output=True, text=True, timeout=180, env=dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))),
        )  # fmt: skip
        assert "RESULT True tasks" in nb.stdout, nb.stdout + nb.stderr[-3000:]
        assert "AGAIN True tasks" in nb.stdout
        notices = [line for line in nb.stderr.splitlines() if line.startswith("jupyter_cluster:")]
        assert len(notices) == 1, nb.stderr[-3000:]  # said once, in one line, for both maps
        assert "did not answer a direct connection" in notices[0] and "through the Dask scheduler" in notices[0]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)
        for ns in created:
            subprocess.run(["ip", "netns", "pids", ns], capture_output=True)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def test_the_task_path_still_does_everything_the_direct_path_does(cluster):
    """engine.path=tasks (the fallback): order, errors as data, capture, budgets, no leases."""
    import dask

    def work(x):
        if x == 7:
            raise ValueError("seven")
        print("item", x)
        time.sleep(0.002)
        return x * 2

    with dask.config.set({"jupyter-cluster.engine.path": "tasks"}):
        out = mapping.map(work, range(300), errors="collect", client=cluster, progress=False)
        job = mapping.last_job()
    assert job.path == "tasks" and job.leases == 0
    assert [v for i, v in enumerate(out) if i != 7] == [2 * i for i in range(300) if i != 7]
    assert isinstance(out[7], ValueError) and job.outputs[8] == "item 8\n"
    assert job.chunks_submitted > 2  # chunked, more than one task per worker
