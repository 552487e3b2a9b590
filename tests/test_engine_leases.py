"""The direct path: lease tasks hold worker threads, batches go to them over Dask's comm.

Real clusters throughout: the module's 2-worker local cluster (TLS by
default), extra ``dask worker`` processes, a client process killed with
``kill -9``, and a notebook process in its own network namespace that reaches
the scheduler but not the workers.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import cloudpickle
import pytest

from jupyter_cluster import mapping

from .conftest import wait_for

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def interval(x):
    """Sleep a little and say when and where (process) it ran."""
    t0 = time.time()
    time.sleep(0.05)
    return (os.getpid(), t0, time.time())


def leases_running(client) -> dict[str, list[str]]:
    """Worker address -> keys of lease tasks it is processing, as the scheduler sees it."""
    return {w: [k for k in keys if str(k).startswith("jc-lease-")] for w, keys in client.processing().items()}


def no_leases(client) -> bool:
    return not any(leases_running(client).values())


def worker_tls_args(handle) -> list[str]:
    if not handle.address.startswith("tls://"):
        return []
    sec = handle.client.security
    return [
        "--tls-ca-file",
        sec.tls_ca_file,
        "--tls-cert",
        sec.tls_client_cert,
        "--tls-key",
        sec.tls_client_key or sec.tls_client_cert,
    ]


def test_a_map_runs_on_leases_and_the_scheduler_sees_one_task_per_thread(cluster):
    client = cluster.client
    wait_for(lambda: no_leases(client), timeout=15, message="earlier leases to end")
    seen = []
    job = mapping.MapJob(interval, (range(200),), client=cluster, progress=False)
    it = iter(job)
    next(it)
    seen.append(leases_running(client))
    out = [None] + list(it)
    assert len(out) == 200
    assert job.path == "direct"
    # One lease per worker thread (2 workers x 1 thread), however many batches ran.
    assert job.leases == 2 and job.chunks_submitted > job.leases
    assert sum(len(v) for v in seen[0].values()) == 2 and all(len(v) == 1 for v in seen[0].values())


def test_leases_end_after_their_client_process_is_killed(cluster, tmp_path):
    client = cluster.client
    sec = client.security
    script = tmp_path / "owner.py"
    script.write_text(
        textwrap.dedent(f"""
        import time
        from distributed import Client
        from distributed.security import Security
        import jupyter_cluster as jc

        def nap(x):
            time.sleep(0.1)
            return x

        if __name__ == "__main__":
            security = Security(tls_ca_file={sec.tls_ca_file!r}, tls_client_cert={sec.tls_client_cert!r},
                                tls_client_key={(sec.tls_client_key or sec.tls_client_cert)!r}, require_encryption=True) \\
                if {cluster.address!r}.startswith("tls://") else None
            c = Client({cluster.address!r}, security=security)
            jc.map(nap, range(100000), client=c, progress=False)
    """)
    )
    wait_for(lambda: no_leases(client), timeout=15, message="earlier leases to end")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(
            lambda: sum(len(v) for v in leases_running(client).values()) == 2,
            timeout=60,
            message="the owner's 2 leases to run",
        )
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        killed = time.monotonic()
        wait_for(lambda: no_leases(client), timeout=20, message="the killed client's leases to end")
        assert time.monotonic() - killed < 20
        # The threads are free: a plain task runs at once on each worker.
        for w in client.scheduler_info(n_workers=-1)["workers"]:
            assert client.submit(os.getpid, workers=[w], pure=False).result(timeout=10) > 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_a_plain_task_gets_a_free_thread_and_never_shares_a_leased_one(cluster):
    import jupyter_cluster as jc

    client = cluster.client
    wait_for(lambda: no_leases(client), timeout=15, message="earlier leases to end")
    # A pool capped at 1 process leases 1 of the 2 threads: a plain task gets the other at once.
    with jc.Pool(processes=1, cluster=cluster, progress=False) as pool:
        result = pool.map_async(interval, range(60))
        wait_for(
            lambda: sum(len(v) for v in leases_running(client).values()) == 1, timeout=30, message="the pool's lease"
        )
        t0 = time.monotonic()
        assert client.submit(os.getpid, pure=False).result(timeout=10) > 0
        assert time.monotonic() - t0 < 3
        assert not result.ready()  # it ran while the map was running
        assert len(result.get(timeout=60)) == 60

    # A map using every thread: a task submitted meanwhile waits for a thread,
    # it never runs beside a lease on the same (1-thread) worker.
    wait_for(lambda: no_leases(client), timeout=15, message="the pool's lease to end")
    job = mapping.MapJob(interval, (range(80),), client=cluster, progress=False)
    it = iter(job)
    next(it)
    task = client.submit(interval, -1, pure=False)
    rest = list(it)
    pid, start, end = task.result(timeout=60)
    same_worker = [(s, e) for p, s, e in rest if p == pid]
    assert same_worker, "the map used the task's worker too"
    overlapping = [(s, e) for s, e in same_worker if s < end and start < e]
    assert not overlapping, f"a plain task ran beside a lease on a 1-thread worker: {overlapping[:3]}"


def test_leases_of_a_gpu_map_land_only_on_workers_with_the_resource(cluster):
    client = cluster.client
    proc = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_worker", cluster.address, "--nthreads", "2",
         "--resources", "GPU=1", "--no-nanny", "--no-dashboard", "--host", "127.0.0.1", *worker_tls_args(cluster)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:

        def gpu_workers():
            info = client.scheduler_info(n_workers=-1)["workers"]
            return [a for a, w in info.items() if w.get("resources", {}).get("GPU")]

        gpu = wait_for(gpu_workers, timeout=60, message="the GPU worker to join")
        wait_for(lambda: no_leases(client), timeout=15, message="earlier leases to end")
        job = mapping.MapJob(interval, (range(40),), resources={"GPU": 1}, client=cluster, progress=False)
        it = iter(job)
        next(it)
        during = leases_running(client)
        rest = list(it)
        assert len(rest) == 39 and job.path == "direct"
        # GPU=1 on a worker with GPU=1 and 2 threads: one lease, there and nowhere else.
        assert job.leases == 1
        assert {w for w, keys in during.items() if keys} == set(gpu)
        assert set(job.workers_used) == set(gpu)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    wait_for(
        lambda: len(client.scheduler_info(n_workers=-1)["workers"]) == 2, timeout=30, message="the GPU worker to leave"
    )


def test_the_direct_path_uses_the_clusters_tls_and_refuses_a_client_without_credentials(cluster):
    from distributed.core import rpc

    if not cluster.address.startswith("tls://"):
        pytest.skip("the module's cluster is not a TLS cluster (local.tls is off here)")
    client = cluster.client
    assert mapping.map(abs, range(-20, 0), client=cluster, progress=False) == list(range(20, 0, -1))
    job = mapping.last_job()
    assert job.path == "direct" and all(w.startswith("tls://") for w in job.workers_used)
    # Without the cluster's credentials a worker's handlers cannot be reached at all.
    worker = next(iter(client.scheduler_info(n_workers=-1)["workers"]))
    plain = worker.replace("tls://", "tcp://")

    async def ping(address):
        r = rpc(address, timeout=5)
        try:
            return await r.jc_ping()
        finally:
            await r.close_rpc()

    for address in (worker, plain):
        with pytest.raises(Exception):  # noqa: B017 - TLS refuses in several ways (TypeError without a context, OSError, timeouts)
            client.sync(ping, address)


def test_retry_storm_stops_when_cancelled_and_keeps_output_bounded(cluster):
    """Issue 18.4: retries=10**9 on an item that always raises."""
    import _thread

    client = cluster.client

    def always(x):
        print("attempt of", x)
        raise ValueError("never works")

    # Bounded output: only the last attempt's lines are kept.
    out = mapping.map(always, [1], retries=2000, errors="collect", client=cluster, progress=False)
    assert isinstance(out[0], ValueError)
    text = mapping.last_job().outputs[0]
    assert text.count("attempt of 1") == 1 and "retry 2000 of 2000" in text and len(text) < 200

    wait_for(lambda: no_leases(client), timeout=15, message="earlier leases to end")
    timer = threading.Timer(1.0, _thread.interrupt_main)
    timer.start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        mapping.map(always, range(2), retries=10**9, client=cluster, progress=False)
    assert time.monotonic() - t0 < 3
    # The workers stopped retrying: nothing of the map is still running on them.
    wait_for(lambda: not any(client.processing().values()), timeout=3, message="the retrying items to stop")


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
            capture_output=True, text=True, timeout=180, env=dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(__file__))),
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


def loaded_modules(x):
    return sorted(
        m for m in sys.modules if m.startswith(("jupyter_cluster", "IPython", "ipywidgets", "anywidget", "tests"))
    )


def test_worker_processes_import_only_what_runs_on_them(cluster):
    """Issue 13 start-up: no notebook side (sessions, widgets, telemetry hub, IPython) in a worker process."""
    # Fresh worker processes: earlier tests' functions can make a worker import
    # this test module (found on the workers' path), which imports the map front.
    cluster.client.restart()
    mods = mapping.map(loaded_modules, [0], client=cluster, progress=False)[0]
    assert "tests.test_engine_leases" not in mods
    assert "jupyter_cluster.engine.worker" in mods
    notebook_side = [m for m in mods if m.split(".")[0] in ("IPython", "ipywidgets", "anywidget")
                     or m in ("jupyter_cluster.session", "jupyter_cluster.mapping", "jupyter_cluster.engine.job",
                              "jupyter_cluster.widgets", "jupyter_cluster.telemetry.progress", "jupyter_cluster.magics")]  # fmt: skip
    assert not notebook_side, f"worker processes imported {notebook_side}"


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
