"""The map engine on a real 2-worker cluster: order, chunking, backpressure, errors, interrupt, resources."""

from __future__ import annotations

import _thread
import os
import subprocess
import sys
import threading
import time

import cloudpickle
import pytest

from jupyter_cluster import mapping
from jupyter_cluster.errors import ClusterError

from ..conftest import wait_for
from ..helpers import assert_ran_on_leases, worker_tls_args

# Functions defined here travel by value: the workers cannot import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def square(x):
    return x * x


def slow(x, t=0.05):
    time.sleep(t)
    return x


def fail_on_three(x):
    if x == 3:
        raise ValueError(f"bad item {x}")
    return x


def test_map_is_ordered_and_matches_builtin(cluster):
    assert mapping.map(square, range(50), client=cluster) == [x * x for x in range(50)]
    assert mapping.map(pow, [2, 3, 4], [5, 2, 1], client=cluster) == [32, 9, 4]
    assert mapping.map(square, [], client=cluster) == []


def test_unordered_gives_every_result_once(cluster):
    out = mapping.map(slow, "abcd", [1.0, 0.0, 0.0, 0.0], chunksize=1, ordered=False, client=cluster)
    assert sorted(out) == ["a", "b", "c", "d"]
    assert out[0] != "a"  # the slow one cannot arrive first


def test_generator_of_100k_is_consumed_lazily_with_bounded_tasks(cluster):
    consumed = 0

    def gen():
        nonlocal consumed
        for i in range(100_000):
            consumed += 1
            yield i

    job = mapping.imap(square, gen(), client=cluster)
    assert job.total is None
    first = next(job)
    assert first == 0
    # Only a bounded stretch of the input was read ahead of the first result.
    assert consumed < 100_000
    total = 1 + sum(1 for _ in job)
    assert total == 100_000 and consumed == 100_000 and job.total == 100_000
    assert job.peak_in_flight <= job.max_in_flight
    assert job.chunks_submitted < 500  # chunked, not one task per item
    assert job.results == {}  # imap does not keep what it yielded


class Counted:
    """A large value that records each time it is unpickled on a worker."""

    def __init__(self, path, payload):
        self.path = path
        self.payload = payload

    def __reduce__(self):
        return (_rebuild_counted, (self.path, self.payload))


def _rebuild_counted(path, payload):
    with open(path, "a") as fh:
        fh.write(f"{os.getpid()}\n")
    return Counted(path, payload)


def test_large_closure_is_sent_once_per_worker_not_per_item(cluster, tmp_path):
    log = tmp_path / "loads.txt"
    big = Counted(str(log), b"x" * 2_000_000)

    def use_big(i):
        return len(big.payload) + i

    out = mapping.map(use_big, range(40), chunksize=1, client=cluster)  # 40 tasks
    assert out == [2_000_000 + i for i in range(40)]
    loads = log.read_text().split()
    # Once per worker (2); a replica racing a task's own fetch may add one per worker.
    assert 1 <= len(loads) <= 4, f"the 2 MB value was unpickled {len(loads)} times for 40 tasks"


def test_errors_raise_reraises_original_type_with_item_and_traceback(cluster):
    with pytest.raises(ValueError, match="bad item 3") as info:
        mapping.map(fail_on_three, range(20), chunksize=2, client=cluster)
    notes = "\n".join(info.value.__notes__)
    assert "item 3 (3)" in notes and "Remote traceback" in notes and "fail_on_three" in notes
    job = mapping.last_job()
    assert job.state == "failed" and job.finished and job.in_flight == 0


def test_errors_collect_puts_exceptions_in_the_results(cluster):
    out = mapping.map(fail_on_three, range(8), errors="collect", client=cluster)
    assert isinstance(out[3], ValueError)
    assert [x for i, x in enumerate(out) if i != 3] == [0, 1, 2, 4, 5, 6, 7]
    job = mapping.last_job()
    assert job.failed == 1 and job.done == 7 and list(job.errors) == [3]


def test_retries_rerun_an_item_that_raised(cluster, tmp_path):
    marker = str(tmp_path / "failed-once")

    def flaky(x):
        if x == 2 and not os.path.exists(marker):
            open(marker, "w").close()
            raise RuntimeError("first attempt fails")
        return x

    assert mapping.map(flaky, range(4), retries=1, client=cluster) == [0, 1, 2, 3]
    os.remove(marker)
    out = mapping.map(flaky, range(4), retries=0, errors="collect", client=cluster)
    assert isinstance(out[2], RuntimeError)


def test_timeout_fails_only_the_slow_item(cluster):
    def spin(x):
        if x == 1:
            while True:  # pure Python: stopped as soon as it is over time
                pass
        return x

    t0 = time.monotonic()
    out = mapping.map(spin, range(4), timeout=0.5, errors="collect", client=cluster)
    assert time.monotonic() - t0 < 20
    assert isinstance(out[1], TimeoutError) and "--timeout" in str(out[1])
    assert [out[0], out[2], out[3]] == [0, 2, 3]


def test_prints_are_captured_per_item(cluster):
    def talk(x):
        print("item says", x)
        return x

    seen = []
    job = mapping.MapJob(talk, (range(5),), client=cluster, on_output=lambda i, t, f: seen.append((i, t, f)))
    job.run()
    assert job.outputs == {i: f"item says {i}\n" for i in range(5)}
    assert sorted(seen) == [(i, f"item says {i}\n", False) for i in range(5)]
    assert set(job.durations) == set(range(5))


def test_observer_factories_hear_start_progress_finish(cluster):
    calls = []

    class Obs:
        def job_started(self, job):
            calls.append("started")

        def job_progress(self, job):
            calls.append("progress")

        def job_finished(self, job):
            calls.append(("finished", job.done, job.state))

    def factory(job, progress):
        assert progress is False
        return Obs()

    mapping.add_observer_factory(factory)
    try:
        mapping.map(square, range(10), client=cluster, progress=False)
    finally:
        mapping.remove_observer_factory(factory)
    assert calls[0] == "started" and calls[-1] == ("finished", 10, "finished") and "progress" in calls


def test_interrupt_cancels_within_two_seconds_and_keeps_results(cluster):
    timer = threading.Timer(1.0, _thread.interrupt_main)
    timer.start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        mapping.map(slow, range(200), [0.05] * 200, chunksize=2, client=cluster)
    elapsed = time.monotonic() - t0
    assert elapsed < 1.0 + 2.0
    job = mapping.last_job()
    assert job.state == "cancelled" and job.in_flight == 0
    assert_ran_on_leases(job)  # the interrupt cancelled lease batches, not a fallback's tasks
    assert 0 < job.done < 200 and len(job.results) == job.done
    assert all(job.results[i] == i for i in job.results)
    # The workers stop between items, so the cluster is free again at once.
    t1 = time.monotonic()
    assert mapping.map(square, range(10), client=cluster) == [x * x for x in range(10)]
    assert time.monotonic() - t1 < 5


def test_missing_resources_fail_fast(cluster):
    with pytest.raises(ClusterError, match="GPU=1"):
        mapping.map(square, range(3), resources={"GPU": 1}, client=cluster)


def test_resources_restrict_items_to_workers_that_have_them(cluster):
    proc = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_worker", cluster.address, "--nthreads", "1",
         "--resources", "GPU=1", "--no-nanny", "--no-dashboard", "--host", "127.0.0.1", *worker_tls_args(cluster)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        client = cluster.client

        def gpu_workers():
            info = client.scheduler_info(n_workers=-1)["workers"]
            return [a for a, w in info.items() if w.get("resources", {}).get("GPU")]

        gpu = wait_for(gpu_workers, timeout=60, message="the GPU worker to join")
        out = mapping.map(square, range(20), resources={"GPU": 1}, client=cluster)
        assert out == [x * x for x in range(20)]
        assert set(mapping.last_job().workers_used) == set(gpu)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    wait_for(
        lambda: len(cluster.client.scheduler_info(n_workers=-1)["workers"]) == 2,
        timeout=30,
        message="the GPU worker to leave",
    )


# -- faults: killed workers, a poison pill, a vanished scheduler -------------------------------
@pytest.fixture(scope="module")
def fault_cluster():
    """A 2-worker cluster that gives up on a task after 2 worker deaths, with patient nannies.

    Built directly (not through ``jupyter_cluster.start``) to pass test-only
    settings: on a loaded 2-core CI machine a restarted worker process can take
    longer than the nanny's default start-up limit.

    ``lost-worker-timeout`` is raised here as ``jupyter_cluster.start`` raises
    it for the whole process (``backends.local.backend._keep_nannies``), so the
    module does not depend on an earlier test having started a cluster: a
    LocalCluster closes a worker's nanny for good when, 15 s after *any* death
    of that worker, no worker of its name is registered.  Run without that
    (this pair alone), a SIGKILL test's check fell inside a poison pill's
    restart, both nannies closed, and the last map of the poison test waited
    for workers until the 300 s test timeout.
    """
    import dask.config
    from distributed import Client, LocalCluster

    with dask.config.set({"distributed.deploy.lost-worker-timeout": "1h"}):
        lc = LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
            dashboard_address="127.0.0.1:0", death_timeout=120,
        )  # fmt: skip
        lc.scheduler.allowed_failures = 1  # the scheduler runs in this process
        client = Client(lc, set_as_default=False)
        yield client
        client.close()
        lc.close()


def _worker_pids(client):
    try:
        return client.run(os.getpid)
    except Exception:  # a worker is restarting
        return {}


def _n_workers(client):
    return len(client.scheduler_info(n_workers=-1)["workers"])


def _used(job) -> set[str]:
    """The addresses ``job`` has results from (read from another thread than the map's)."""
    while job is not None:
        try:
            return set(job.workers_used)
        except RuntimeError:  # the map added a worker while we copied
            continue
    return set()


def held_on_originals(x, pids, folder):
    """``slow`` (50 ms), but on the original worker processes (``pids``) it waits for the fault test's steps.

    An original first waits until both originals have run an item (so each
    can deliver results before the first kill), and, from the first kill
    (``folder/killing`` exists) until the second (``folder/killed``), the
    surviving original holds its items: neither can finish the map alone, so
    the map outlasts a replacement worker's start however slow that is on a
    loaded machine.  The deadline only bounds a broken test.
    """
    time.sleep(0.05)
    pid = os.getpid()
    if pid in pids:
        open(os.path.join(folder, f"ran-{pid}"), "w").close()
        deadline = time.monotonic() + 240

        def held():
            if not all(os.path.exists(os.path.join(folder, f"ran-{p}")) for p in pids):
                return True
            return os.path.exists(os.path.join(folder, "killing")) and not os.path.exists(
                os.path.join(folder, "killed")
            )

        while held() and time.monotonic() < deadline:
            time.sleep(0.02)
    return x


def test_sigkilled_workers_mid_map_lose_nothing(fault_cluster, tmp_path):
    client = fault_cluster
    wait_for(lambda: _n_workers(client) == 2, timeout=60, message="2 workers")
    original = _worker_pids(client)  # address -> pid
    assert len(original) == 2
    killing, killed = tmp_path / "killing", tmp_path / "killed"
    before = mapping.last_job()
    kills = []
    errors = []

    def current():
        job = mapping.last_job()
        return job if job is not before else None

    def wait(cond, what):
        deadline = time.monotonic() + 180
        while not cond():
            if time.monotonic() > deadline:
                raise AssertionError(f"the killer waited 180 s for {what}")
            time.sleep(0.02)

    def killer():
        # Kill on the map's progress, not on a clock: each original worker once it has
        # delivered results, the second only after a restarted worker delivered some,
        # so the results come from both originals and a replacement (a clock-timed kill
        # on a loaded machine hit workers that had delivered nothing: 2 addresses).  The
        # items hold the surviving original between the kills (held_on_originals): on a
        # loaded machine it used to finish the map before the replacement had started.
        try:
            wait(lambda: set(original) <= _used(current()), "results from both original workers")
            first = sorted(original)[0]
            killing.touch()
            os.kill(original[first], 9)
            kills.append(first)
            wait(lambda: _used(current()) - set(original), "results from a restarted worker")
            second = next(a for a in original if a != first)
            os.kill(original[second], 9)
            kills.append(second)
        except BaseException as e:
            errors.append(e)
        finally:
            killed.touch()  # whatever happened, the held items go on

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    pids = sorted(original.values())
    out = mapping.map(held_on_originals, range(200), [pids] * 200, [str(tmp_path)] * 200, client=fault_cluster)
    t.join(30)
    assert not errors, errors
    assert out == list(range(200))  # every result exactly once, in order
    assert len(kills) == 2
    job = mapping.last_job()
    assert job.done == 200 and job.failed == 0
    assert len(job.workers_used) > 2  # restarted workers (new addresses) took over
    # ... on the direct path: the dead leases' batches went to leases on the other workers, not to tasks
    assert_ran_on_leases(job)
    assert job.leases > 0  # at least the restarted worker's lease was placed by this map
    wait_for(lambda: _n_workers(client) == 2, timeout=120, message="workers to come back")


def poison(x):
    if x == 7:
        os._exit(1)  # kills whichever worker runs it
    return x * 10


def test_poison_pill_fails_with_worker_lost_error_naming_the_item(fault_cluster):
    from jupyter_cluster.errors import WorkerLostError

    client = fault_cluster
    wait_for(lambda: _n_workers(client) == 2, timeout=60, message="2 workers")
    out = mapping.map(poison, range(4, 10), chunksize=1, errors="collect", client=fault_cluster)
    assert isinstance(out[3], WorkerLostError) and "item 3 (7)" in str(out[3])
    assert [v for i, v in enumerate(out) if i != 3] == [40, 50, 60, 80, 90]
    assert_ran_on_leases(mapping.last_job())  # the lease path counted the deaths, not Dask's task retries
    # The cluster is still usable (its nannies restart the killed workers).
    wait_for(lambda: _n_workers(client) >= 1, timeout=120, message="a worker to come back")
    assert mapping.map(square, range(5), client=fault_cluster) == [0, 1, 4, 9, 16]


def test_vanished_scheduler_raises_cluster_error_quickly(tmp_path):
    import jupyter_cluster as jc

    sched_file = tmp_path / "scheduler.json"
    sched = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0",
         "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(sched_file)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    worker = None
    handle = None
    try:
        wait_for(
            lambda: sched_file.exists() and sched_file.stat().st_size > 0, timeout=60, message="the scheduler file"
        )
        import json

        address = json.loads(sched_file.read_text())["address"]
        worker = subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_worker", address, "--nthreads", "1", "--no-nanny",
             "--no-dashboard", "--host", "127.0.0.1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        handle = jc.connect(address)
        handle.wait_for_workers(1, timeout=60)
        killed_at = []
        before = mapping.last_job()

        def kill():
            # On the map's progress, not a clock: once results came back its leases run, so the
            # scheduler vanishes under a map fed over the direct path (a kill 1 s after the start
            # came, on a loaded machine, before the map had placed a lease).
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                job = mapping.last_job()
                if job is not before and job is not None and job.done > 0:
                    break
                time.sleep(0.02)
            killed_at.append(time.monotonic())
            sched.kill()

        killer = threading.Thread(target=kill, daemon=True)
        killer.start()
        with pytest.raises(ClusterError, match="stopped answering"):
            mapping.map(slow, range(600), [0.1] * 600, client=handle)  # 60 s of work: it outlasts the kill
        killer.join(30)
        # Seconds, not the 120 s after which any silent scheduler counts as lost (SchedulerWatch):
        # the refused connection told.  Generous for a loaded machine.
        assert killed_at and time.monotonic() - killed_at[0] < 60
        job = mapping.last_job()
        assert job is not before and job.state == "failed"
        assert_ran_on_leases(job)  # the scheduler vanished under a map fed over the direct path
    finally:
        for p in (worker, sched):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(timeout=30)
        if handle is not None and not handle.closed:
            handle.close()


def test_a_chunk_stops_at_its_time_budget():
    """run_chunk (no Dask needed) returns fewer values than items once its budget is spent."""
    import time as _time

    from jupyter_cluster.engine import worker
    from jupyter_cluster.engine.protocol import MapRun

    items = [0.02] * 10
    run = MapRun("budget-test", cloudpickle.dumps(_time.sleep), False, retries=0, timeout=None, capture=True)
    values, timings, *_ = worker.run_chunk(run, items, budget=0.05)
    assert 1 <= len(values) < len(items)
    # Timings are (items, seconds each) runs: every item run is timed, and they add up to the budget.
    assert sum(n for n, _ in timings) == len(values) and sum(n * d for n, d in timings) >= 0.05
    # Without a budget every item runs.
    values, *_ = worker.run_chunk(run, items[:3])
    assert len(values) == 3


def test_items_a_budget_sent_back_are_run_once_in_order(cluster):
    def slow_square(x):
        time.sleep(0.04)
        return x * x

    job = mapping.MapJob(slow_square, (range(12),), client=cluster)
    assert job.remembered is None  # new code: nothing known, so the first chunks are budgeted probes
    out = job.run().result_list()
    assert out == [x * x for x in range(12)]
    # The probes carried more 40 ms items than their 30 ms budget allows; the rest came back.
    assert job.chunks_cut >= 1
    assert sum(n for _, n, *_ in job.chunk_log) == 12


def test_item_durations_are_remembered_for_the_next_map_of_the_same_code(cluster):
    def tiny_sleep(x):
        time.sleep(0.002)
        return x

    first = mapping.MapJob(tiny_sleep, (range(200),), client=cluster).run()
    measured = sum(first.durations.values()) / 200
    second = mapping.MapJob(tiny_sleep, (range(200),), client=cluster)
    assert second.remembered == pytest.approx(measured)
    assert second.run().result_list() == list(range(200))
    # No probes this time: chunks were sized from the remembered duration, so
    # (short of a machine slowed to half speed) none ran out of budget.
    assert first.chunks_cut >= 1 and second.chunks_cut < first.chunks_cut


def test_a_map_on_a_client_that_let_go_of_its_scheduler_says_so(cluster):
    """A client closed under a map (the session lets go of a scheduler that went away) is a ClusterError, not Dask's ClosedClientError."""
    import dask
    from distributed import Client

    other = Client(cluster.address, security=cluster.security, set_as_default=False)
    assert mapping.map(square, [3], client=other, progress=False) == [9]
    other.close()
    with dask.config.set({"jupyter-cluster.engine.path": "tasks"}):
        with pytest.raises(ClusterError, match="stopped answering"):
            mapping.map(square, range(4), client=other, progress=False)
