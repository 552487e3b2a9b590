"""Pool survives real faults: SIGKILLed workers, a poison pill, a vanished scheduler.

The module runs its own 2-worker cluster with ``allowed-failures: 1`` (Dask
gives up on a task after 2 worker deaths instead of 4), so that a poison pill
costs a few worker restarts rather than many.  Worker kills are spaced out
(each waits for the nanny's replacement), so no innocent task is hit twice.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time

import pytest

import jupyter_cluster as jc
from jupyter_cluster.errors import ClusterError, WorkerLostError

from ..conftest import wait_for
from ..helpers import gated_square

pytestmark = pytest.mark.slow


def slow_square(x):
    time.sleep(0.05)
    return x * x


def poison(x):
    if x == 7:
        os._exit(1)  # kills the worker process, like a segfault or the OOM killer
    return x


# the module's cluster (tests/conftest.py): Dask gives up on a task after 2 worker deaths instead of 4
pytestmark = pytest.mark.cluster_config({"distributed.scheduler.allowed-failures": 1})


def worker_pids(client) -> dict[str, int]:
    return client.run(os.getpid)


def wait_for_replacement(client, dead_pid: int, n: int = 2) -> None:
    def replaced():
        try:
            pids = set(worker_pids(client).values())
        except Exception:  # a worker is mid-restart
            return False
        return len(pids) >= n and dead_pid not in pids

    wait_for(replaced, timeout=90, interval=0.1, message="the nanny to replace the killed worker")


def test_map_survives_sigkilled_workers(cluster, tmp_path):
    client = cluster.client
    flag = str(tmp_path / "kills-done")
    items = list(range(150))
    expected = [x * x for x in items]
    with jc.Pool() as pool:
        assert pool.map(abs, [-1]) == [1]  # warm: the function cache, imports
        result = pool.map_async(functools.partial(gated_square, flag), items, chunksize=3)
        for kill in range(3):
            wait_for(lambda: any(client.processing().values()), timeout=60, message="tasks running")
            assert not result.ready()
            victim = sorted(worker_pids(client).items())[kill % 2][1]
            os.kill(victim, signal.SIGKILL)
            wait_for_replacement(client, victim)
        open(flag, "w").close()
        values = result.get(timeout=120)
    # every result exactly once, in input order
    assert values == expected


def test_poison_pill_fails_alone_and_cluster_stays_usable(cluster):
    with jc.Pool() as pool:
        out = []
        it = pool.imap(poison, range(12))
        while True:
            try:
                out.append(it.next(timeout=150))
            except StopIteration:
                break
            except WorkerLostError as exc:
                out.append("lost")
                message = str(exc)
        assert out == [0, 1, 2, 3, 4, 5, 6, "lost", 8, 9, 10, 11]  # the rest of the map is not lost
        assert "item 7" in message  # each wait above is bounded (150 s): a map that kept killing workers fails

        with pytest.raises(WorkerLostError, match="apply_async\\(poison\\)"):
            pool.apply(poison, (7,))

        cluster.wait_for_workers(2, timeout=90)
        assert pool.map(slow_square, range(6)) == [0, 1, 4, 9, 16, 25]


SCHEDULER = """
from distributed import LocalCluster
cluster = LocalCluster(n_workers=1, threads_per_worker=2, processes=False, protocol="tcp",
                       host="127.0.0.1", dashboard_address="127.0.0.1:0")
print(cluster.scheduler_address, flush=True)
import time
time.sleep(600)
"""


def test_vanished_scheduler_is_a_clear_error_within_seconds(cluster):
    proc = subprocess.Popen([sys.executable, "-c", SCHEDULER], stdout=subprocess.PIPE, text=True)
    try:
        address = proc.stdout.readline().strip()
        assert address.startswith("tcp://"), address
        remote = jc.connect(address)
        try:
            pool = jc.Pool(cluster=remote)
            assert pool.map(abs, [-1]) == [1]
            running_apply = pool.apply_async(time.sleep, (60,))
            running_map = pool.map_async(time.sleep, [0.2] * 200)
            wait_for(lambda: any(remote.client.processing().values()), timeout=30)

            os.kill(proc.pid, signal.SIGKILL)  # the scheduler (and its worker) disappear
            t0 = time.monotonic()
            for result in (running_apply, running_map):
                with pytest.raises(ClusterError) as info:
                    result.get(timeout=30)
                assert "scheduler" in str(info.value) or "cluster" in str(info.value)
            # Seconds, not the 120 s after which any silent scheduler counts as lost; generous for a loaded CI.
            assert time.monotonic() - t0 < 60
            t0 = time.monotonic()
            with pytest.raises(ClusterError):
                pool.map(abs, [-1, -2])
            with pytest.raises(ClusterError):
                pool.apply(abs, (-1,))
            assert time.monotonic() - t0 < 60
            pool.terminate()
        finally:
            remote.close()
    finally:
        proc.kill()
        proc.wait(timeout=30)
    # the module's own cluster is unaffected
    with jc.Pool(cluster=cluster) as pool:
        assert pool.map(abs, [-3]) == [3]
