"""engine.cluster: what the engine asks of a cluster; here, telling a busy scheduler from a lost one.

Real processes: a ``dask scheduler`` and a ``dask worker`` started by the
test, a plain ``distributed.Client`` (not the session's, which lets go of an
attached scheduler at once), and a scheduler whose event loop is blocked.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import cloudpickle
import pytest
from distributed import Client

from jupyter_cluster import mapping
from jupyter_cluster.engine import cluster as engine_cluster
from jupyter_cluster.errors import ClusterError

from .conftest import wait_for

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def nap(x, seconds):
    time.sleep(seconds)
    return x * x


def block_loop(seconds):
    """Run on the scheduler's event loop (``run_on_scheduler`` with a plain function): it answers nobody meanwhile."""
    time.sleep(seconds)
    return seconds


@pytest.fixture
def own_scheduler(tmp_path):
    """A scheduler process and one 2-thread worker process on loopback; yields the scheduler's address and process."""
    sched_file = tmp_path / "scheduler.json"
    sched = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0",
         "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(sched_file)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    worker = None
    try:
        wait_for(
            lambda: sched_file.exists() and sched_file.stat().st_size > 0, timeout=60, message="the scheduler file"
        )
        address = json.loads(sched_file.read_text())["address"]
        worker = subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_worker", address, "--nthreads", "2", "--no-nanny",
             "--no-dashboard", "--host", "127.0.0.1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        yield address, sched
    finally:
        for p in (worker, sched):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(timeout=30)


@pytest.mark.parametrize("path", ["direct", "tasks"])
def test_a_map_outlives_a_scheduler_too_busy_to_answer_its_reconnecting_client(own_scheduler, path):
    """Issue 26 "slow is not gone": a client cut off from a scheduler whose loop is blocked for 6 s waits for it.

    The client's connection drops while the scheduler is busy, so the client
    is reconnecting for longer than the watch's 2 s grace; the scheduler's
    port still accepts connections, so the map waits, and finishes once the
    scheduler answers again, every result once and in order.
    """
    import dask

    address, _ = own_scheduler
    client = Client(address, set_as_default=False)
    try:
        client.wait_for_workers(1, timeout=60)
        assert mapping.map(nap, [2], [0.0], client=client, progress=False) == [4]  # reachability known, engine loaded
        cut = []

        def busy_then_cut():
            threading.Thread(target=lambda: client.run_on_scheduler(block_loop, 6.0), daemon=True).start()
            time.sleep(0.5)  # the scheduler's loop is blocked now
            client.loop.add_callback(lambda: client.scheduler_comm.comm.abort())
            cut.append(time.monotonic())

        threading.Timer(0.5, busy_then_cut).start()
        t0 = time.monotonic()
        with dask.config.set({"jupyter-cluster.engine.path": path}):
            out = mapping.map(nap, range(60), [0.05] * 60, client=client, progress=False)
        job = mapping.last_job()
        assert out == [x * x for x in range(60)]
        assert job.path == path and job.state == "finished"
        assert cut and time.monotonic() - t0 > 6.0  # it did wait out the busy scheduler
    finally:
        client.close()


def test_a_scheduler_whose_process_is_gone_is_lost_after_the_grace(own_scheduler):
    """The other side: a killed scheduler (its port refuses connections) is lost within seconds, not after the patience."""
    address, sched = own_scheduler
    client = Client(address, set_as_default=False)
    try:
        client.wait_for_workers(1, timeout=60)
        assert mapping.map(nap, [3], [0.0], client=client, progress=False) == [9]
        watch = engine_cluster.SchedulerWatch(client)
        assert engine_cluster.scheduler_accepts(address)
        assert not watch.lost()
        sched.kill()
        sched.wait(timeout=30)
        killed = time.monotonic()
        wait_for(watch.lost, timeout=30, message="the watch to say the scheduler is lost")
        assert time.monotonic() - killed < 10
        assert not engine_cluster.scheduler_accepts(address)
        with pytest.raises(ClusterError, match="stopped answering"):
            mapping.map(nap, range(4), [0.0] * 4, client=client, progress=False)
    finally:
        client.close()
