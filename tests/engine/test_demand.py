"""An adaptive cluster grows for a map on leases, and shrinks back after it (engine.demand).

Real local clusters made adaptive with Dask's ``Adaptive`` (``ClusterHandle.adapt``),
with short adaptive settings so that a test takes seconds: Dask looks every
0.2 s, wants 1 s of work per thread, and closes a worker once it has been
idle for 3 looks; the client's idle leases end 1 s after a map.
"""

from __future__ import annotations

import sys
import time

import cloudpickle
import dask
import pytest

import jupyter_cluster as jc
from jupyter_cluster import mapping
from jupyter_cluster.engine.demand import MAX_DEMAND, wanted_threads

from ..conftest import wait_for

cloudpickle.register_pickle_by_value(sys.modules[__name__])

FAST_ADAPT = {
    "distributed.adaptive.interval": "200ms",
    "distributed.adaptive.wait-count": 3,
    "distributed.adaptive.target-duration": "1s",
    "jupyter-cluster.engine.linger": "1s",
}


def nap(i):
    """Sleep a quarter second; say which worker ran the item."""
    from distributed import get_worker

    time.sleep(0.25)
    return i, get_worker().address


def workers(handle) -> int:
    return len(handle.client.scheduler_info(n_workers=-1)["workers"])


def demand_tasks(handle) -> list:
    """The keys of demand tasks the scheduler still holds."""

    def keys(dask_scheduler):
        return [k for k in dask_scheduler.tasks if isinstance(k, str) and "-want-" in k]

    return handle.client.run_on_scheduler(keys)


@pytest.fixture
def adaptive_cluster(request):
    minimum, maximum = request.param
    with dask.config.set(FAST_ADAPT):
        handle = jc.start(workers=1, threads=1)
        try:
            handle.adapt(minimum, maximum)  # Dask's Adaptive reads the settings above as it is made
            yield handle
        finally:
            handle.close()


@pytest.mark.timeout(120)  # without demand the cluster never grows; at 0 workers the map waits forever
@pytest.mark.parametrize("adaptive_cluster", [(1, 3)], indirect=True)
def test_a_map_on_leases_grows_an_adaptive_cluster_and_it_shrinks_back_after(adaptive_cluster):
    handle = adaptive_cluster
    with dask.config.set(FAST_ADAPT):
        # 12 s of work on 1 thread: room for a loaded machine's slow worker start before the map ends.
        job = mapping.MapJob(nap, (range(48),), client=handle, progress=False)
        job.run()
        out = job.take_results()
        assert job.path == "direct"
        # Every result once, in order; more than the first worker ran them, so the cluster grew.
        assert [i for i, _ in out] == list(range(48))
        assert len({addr for _, addr in out}) > 1, out
        wait_for(lambda: demand_tasks(handle) == [], timeout=30, message="the demand tasks to be released")
        # Its leases end after engine.linger; then Adaptive closes the idle workers, down to its minimum.
        wait_for(lambda: workers(handle) == 1, timeout=60, message="the cluster to shrink back to 1 worker")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("adaptive_cluster", [(0, 2)], indirect=True)
def test_a_map_on_an_adaptive_cluster_with_no_workers_starts_one(adaptive_cluster):
    handle = adaptive_cluster
    wait_for(lambda: workers(handle) == 0, timeout=60, message="the idle cluster to shrink to no workers")
    with dask.config.set(FAST_ADAPT):
        job = mapping.MapJob(nap, (range(6),), client=handle, progress=False)
        job.run()
        out = job.take_results()
    assert job.path == "direct"
    assert [i for i, _ in out] == list(range(6))
    wait_for(lambda: demand_tasks(handle) == [], timeout=30, message="the demand tasks to be released")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("adaptive_cluster", [(0, 0)], indirect=True)
def test_a_map_waiting_for_an_adaptive_cluster_to_add_workers_says_so(adaptive_cluster, capfd):
    """Not "add some with %cluster scale N": the map asked the cluster's adaptive scaling (kept at 0 here, then 1)."""
    import threading

    handle = adaptive_cluster
    wait_for(lambda: workers(handle) == 0, timeout=60, message="the idle cluster to shrink to no workers")
    timer = threading.Timer(7.0, handle.adapt, args=(0, 1))  # after the notice (5 s)
    timer.start()
    try:
        with dask.config.set(FAST_ADAPT):
            assert [i for i, _ in jc.map(nap, range(2), client=handle, progress=False)] == [0, 1]
    finally:
        timer.cancel()
    err = capfd.readouterr().err
    assert "has no workers yet; the map waits while its adaptive scaling adds some" in err, err
    assert "%cluster scale" not in err


@pytest.fixture
def gateway(tmp_path):
    from tests.hpc.gateway_server import running_gateway

    with running_gateway(tmp_path) as server:
        yield server


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_map_on_leases_grows_a_gateway_cluster_that_adapts_in_the_gateway(gateway):
    """The gateway's adaptive mode runs server-side on the scheduler's target: the demand tasks reach it too."""
    from dask_gateway import Gateway

    with Gateway() as gw, dask.config.set({"jupyter-cluster.engine.linger": "1s"}):
        cluster = gw.new_cluster()
        try:
            cluster.adapt(minimum=1, maximum=3)
            client = cluster.get_client(set_as_default=False)
            client.wait_for_workers(1, timeout=120)
            # 15 s of work on 1 thread; the gateway adapts every 3 s, then starts a worker process.
            job = mapping.MapJob(nap, (range(60),), client=client, progress=False)
            job.run()
            out = job.take_results()
            assert job.path == "direct"
            assert [i for i, _ in out] == list(range(60))
            assert len({addr for _, addr in out}) > 1, out
            wait_for(
                lambda: len(client.scheduler_info(n_workers=-1)["workers"]) == 1,
                timeout=120,
                message="the gateway cluster to shrink back to 1 worker",
            )
        finally:
            cluster.shutdown()


@pytest.mark.parametrize(
    ("live", "remaining", "per_item", "limit", "want"),
    [
        (1, 60, 0.5, None, 5),  # 30 s of work, 5 s per thread: 6 threads, it has 1
        (1, 24, 0.25, None, 1),  # 6 s: 2 threads
        (4, 4, 10.0, None, 4),  # never more threads than items left
        (3, 10, 0.1, None, 0),  # 1 s of work: the leases it has will do
        (0, 1, 0.001, None, 1),  # no lease at all: always one
        (1, None, 0.5, None, 1),  # an input of unknown length: one more at a time
        (0, 5, None, None, 1),  # nothing ran yet
        (2, 600, 1.0, 3, 1),  # Pool(processes=3)
        (3, 600, 1.0, 3, 0),
        (1, 10**9, 1.0, None, MAX_DEMAND),
    ],
)
def test_a_map_asks_for_the_threads_that_would_run_its_rest_in_the_target_time(live, remaining, per_item, limit, want):
    assert wanted_threads(live, remaining, per_item, 5.0, limit) == want
