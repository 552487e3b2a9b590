"""engine.cluster: what the engine asks of a cluster: telling a busy scheduler from a lost one, and the warm-up.

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
import uuid

import cloudpickle
import pytest
from distributed import Client

from jupyter_cluster import mapping
from jupyter_cluster.engine import cluster as engine_cluster
from jupyter_cluster.engine import scheduler_watch
from jupyter_cluster.engine.worker import EnginePlugin
from jupyter_cluster.errors import ClusterError

from ..conftest import wait_for

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
        watch = scheduler_watch.SchedulerWatch(client)
        assert scheduler_watch.scheduler_accepts(address)
        assert not watch.lost()
        sched.kill()
        sched.wait(timeout=30)
        killed = time.monotonic()
        wait_for(watch.lost, timeout=30, message="the watch to say the scheduler is lost")
        assert time.monotonic() - killed < 10
        assert not scheduler_watch.scheduler_accepts(address)
        with pytest.raises(ClusterError, match="stopped answering"):
            mapping.map(nap, range(4), [0.0] * 4, client=client, progress=False)
    finally:
        client.close()


# -- warm-up: a new cluster is readied for its first map ---------------------------------------
def _telemetry_imported() -> bool:
    return "jupyter_cluster.telemetry" in sys.modules


def test_a_new_local_cluster_is_warmed_for_its_first_map_while_the_user_writes_the_next_cell():
    """``jupyter_cluster.start`` makes the engine's direct-path check and has the workers import what a first
    batch needs, in the background: nothing of it is left for the first map to pay."""
    import jupyter_cluster as jc

    handle = jc.start(workers=2, threads=1, name=f"warm-{uuid.uuid4().hex[:6]}")
    client = handle.client
    try:
        wait_for(
            lambda: all(client.run(_telemetry_imported).values()),
            timeout=30,
            message="the workers to import the telemetry modules before any map",
        )
        assert getattr(client, "_jc_direct", None) is True
        # Direct connections to every worker the warm-up found (all of them, unless one came up more than
        # 10 s late), and spare ones to the scheduler, are open before any map (their TLS handshakes are
        # not the first map's), and the warm-up tasks left nothing behind.
        wait_for(
            lambda: getattr(client, "_jc_warmed", None) or getattr(client, "_jc_warm_error", None),
            timeout=30,
            message="the start's warm-up to end",
        )
        assert getattr(client, "_jc_warm_error", None) is None, client._jc_warm_error
        pool = client.rpc

        def open_comms(addr: str) -> int:
            return len(pool.available.get(addr, ())) + len(pool.occupied.get(addr, ()))

        warmed = client._jc_warmed
        assert set(warmed) <= set(engine_cluster.workers_now(client)) and warmed
        # At least one open connection per warmed worker (its TLS handshake is not the first map's).  The
        # warm-up opens WARM_COMMS_PER_THREAD each, best effort: on a loaded 2-core CI machine 1 of 3 was seen.
        assert all(open_comms(a) >= 1 for a in warmed), [open_comms(a) for a in warmed]
        assert open_comms(client.scheduler.address) >= 2
        assert handle.address.startswith("tls://")
        wait_for(
            lambda: not any(str(k).startswith("jc-warm-") for k in client.run_on_scheduler(_scheduler_task_keys)),
            timeout=30,
            message="the warm-up tasks to be forgotten",
        )
        assert not any(client.processing().values())
    finally:
        handle.close()


def _scheduler_task_keys(dask_scheduler=None) -> list:
    return list(dask_scheduler.tasks)


def test_a_map_right_after_start_keeps_its_leases_while_the_warm_up_runs():
    """``%cluster start`` and a ``%%parallel`` cell run at once (Run All): the start's warm-up tasks must
    not reach a worker after the map's lease, or the idle lease gives them its thread and the map places
    another one.  Seen as 4 leases for 2 one-thread workers (the first start in a process) before the warm-up's tasks went first."""
    import jupyter_cluster as jc

    counts = []
    for _ in range(6):
        handle = jc.start(workers=2, threads=1)
        try:
            job = mapping.MapJob(abs, (range(-3000, 0),), client=handle, progress=False)
            assert len(list(job)) == 3000
            counts.append(job.leases + job._counters.reused)
        finally:
            handle.close()
    assert counts == [2] * 6, f"leases placed per map right after a start: {counts}"


def test_a_comm_closed_while_the_handlers_register_is_asked_again_at_the_next_map():
    """A cluster jupyter_cluster did not start registers the engine's handlers at the first map.  A comm that
    closes during that registration (a ``client.restart()`` under way) says nothing about the workers: that
    map takes the task path, and the next one asks again and goes direct (it used to stay on tasks for the
    client's whole life)."""
    from distributed import LocalCluster

    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        scheduler = cluster.scheduler
        register = scheduler.handlers["register_worker_plugin"]
        closed = []

        async def close_the_first(comm, **msg):  # the scheduler drops the engine registration's connection once
            if msg["name"] != EnginePlugin.name or closed:
                return await register(comm, **msg)
            closed.append(msg["name"])
            await comm.close()

        scheduler.handlers["register_worker_plugin"] = close_the_first
        first = mapping.MapJob(abs, (range(-20, 0),), client=client, progress=False)
        assert sorted(first) == list(range(1, 21))
        assert closed and first.path == "tasks"
        assert getattr(client, "_jc_direct", None) is None
        second = mapping.MapJob(abs, (range(-20, 0),), client=client, progress=False)
        assert sorted(second) == list(range(1, 21))
        assert second.path == "direct"
        assert getattr(client, "_jc_direct", None) is True
