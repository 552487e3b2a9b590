"""The wire contract between the Python builders (:mod:`jupyter_cluster.wire.models`) and the panel (``messages.ts``).

The payloads are made by the real builders and stores, written to
``labextension/src/__tests__/fixtures/wire.json``, then type-checked against
``messages.ts`` (tsc) and fed to the panel's reducers (Jest, ``contract.spec.ts``).
A field renamed in Python changes the fixture and fails tsc or Jest; one renamed
in ``messages.ts`` no longer matches the fixture and fails them too.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import threading
import time

import pytest

from jupyter_cluster import mapping
from jupyter_cluster.engine import direct as engine_dask
from jupyter_cluster.errors import ClusterError
from jupyter_cluster.server.jobs import JobsStore
from jupyter_cluster.server.workers import WorkerFeed
from jupyter_cluster.state import registry
from jupyter_cluster.telemetry import TopicStore
from jupyter_cluster.tracking.table import group_runs
from jupyter_cluster.wire import envelopes as env
from jupyter_cluster.wire import models

from ..conftest import ROOT, wait_for
from ..helpers import assert_ran_on_leases, gated_square

FIXTURE = os.path.join(ROOT, "labextension", "src", "__tests__", "fixtures", "wire.json")

#: two workers as the scheduler's identity() lists them (the fields the builders read)
WORKERS = {
    "tcp://127.0.0.1:40001": {
        "name": "b",
        "status": "running",
        "nthreads": 2,
        "memory_limit": 2_000_000_000,
        "resources": {"GPU": 1},
        "metrics": {"memory": 500_000_000, "cpu": 12.5, "task_counts": {"executing": 2, "long-running": 1}},
    },
    "tcp://127.0.0.1:40000": {
        "name": "a",
        "status": "running",
        "nthreads": 1,
        "memory_limit": 1_000_000_000,
        "resources": {"GPU": 1},  # one key for both: JSON types a missing key as undefined
        "metrics": {"memory": 100_000_000, "cpu": 0.0, "executing": 0},
    },
}


def payloads() -> dict:
    worker_addr = "tcp://127.0.0.1:40000"
    record = registry.ClusterRecord(
        name="demo",
        backend="local",
        address="tls://127.0.0.1:8786",
        owner_pid=4242,
        started=1_700_000_000.0,
        kernel_id="5f0c2a9e-1b7d-4c1e-9a43-2f6e8d0b7c11",
    )
    model = models.cluster_model("demo", "local", record.address, None, True, WORKERS)
    topic = TopicStore("es")
    records = [
        {"step": s, "time": 1_700_000_000.0 + s, "series": {"member": m}, "values": {"reward": s * 0.5 + m}}
        for s in range(3)
        for m in (0, 1)
    ]
    records.append({"step": 2, "time": 1_700_000_003.0, "series": {}, "values": {"load": [1.0, 0.0, 4.0]}})
    topic.add("producer-1", 0, records, worker=worker_addr)
    jobs = JobsStore()
    failure = models.job_failure(
        7,
        ValueError("bad 7"),
        'Traceback (most recent call last):\n  File "<cell>", line 2\nValueError: bad 7\n',
        worker_addr,
        "{'lr': 0.01}",
    )
    job = models.job_message(
        "job-1",
        "%%parallel x in range(10)",
        4242,
        "demo",
        10,
        4,
        1,
        "running",
        1_700_000_001.0,  # after its cluster started (a job older than the cluster ran on an earlier one)
        1_700_000_002.0,
        [failure],
        kernel_id="5f0c2a9e-1b7d-4c1e-9a43-2f6e8d0b7c11",
    )
    jobs.add(job)
    jobs.add(models.job_message("job-0", "Pool.map", 4242, "demo", None, 3, 0, "finished", 0.5, 0.9))
    summary = models.cluster_summary(
        record,
        None,
        "running",
        None,
        {"n_workers": 2, "cores": 3, "memory_limit": 3_000_000_000},
        1,
        ["es"],
        # a second notebook attached to it (its own record, hidden from the list)
        ["9d3e7b21-0000-4000-8000-000000000002"],
    )
    detail = models.cluster_detail(model, summary)
    return {
        "envelopes": envelope_payloads(summary, detail, jobs, topic),
        "clusterSummary": summary,
        "clusterModel": detail,
        "job": job,
        "jobs": jobs.snapshot(),
        "topics": [models.topic_summary(topic)],
        "metrics": topic.model(),
        # the panel checks names and counts before asking; these are what the server accepts
        "names": {name: _accepted(models.validate_name, name) for name in NAMES},
        "counts": {text: _accepted(lambda n: models.validate_count(n, "workers"), int(text)) for text in COUNTS},
        "maxWorkers": models.MAX_WORKERS,
    }


def envelope_payloads(summary, detail, jobs: JobsStore, topic: TopicStore) -> dict:
    """One events-socket envelope of each type, as the server builds them (wire/envelopes.py), and the panel's two."""
    feed = WorkerFeed()
    feed.full(detail)
    # a worker changed, one gone and the totals changed: a diff with every field, summary included
    later = {**detail, "workers": [{**detail["workers"][0], "memory": 900_000_000}], "n_workers": 1}
    diff = feed.diff(later)
    snapshot = jobs.snapshot()
    # a finished job: a running one's duration counts to now
    run = {
        **next(iter(group_runs(jobs.snapshot()["recent"]).values())),
        "cluster": "demo",
        "history": None,
        "metrics": ["reward"],
    }
    run.pop("items", None)
    server = [
        env.clusters_message([summary]),
        env.jobs_message({**snapshot, "history": []}),
        env.cluster_message("demo", detail),
        env.workers_message("demo", diff),
        env.topics_message("demo", [models.topic_summary(topic)]),
        env.metrics_message("demo", "es", topic.model()),
        env.run_message("added", run),
        env.error_message("bad message: unknown message type 'nope'"),
    ]
    client = [env.watch_message("demo", ["es"]), env.interval_message(1000)]
    return {"server": {m["type"]: m for m in server}, "client": {m["type"]: m for m in client}}


NAMES = ["a", "a-1.b_c", "x" * 63, "x" * 64, "-a", ".a", "a b", "a/b", "ä", ""]
COUNTS = ["0", "1", "10000", "10001"]


def _accepted(check, value) -> bool:
    try:
        check(value)
    except ClusterError:
        return False
    return True


def test_builders_shape_what_the_panel_reads():
    p = payloads()
    detail = p["clusterModel"]
    assert [w["name"] for w in detail["workers"]] == ["a", "b"]  # sorted by name
    assert detail["workers"][1]["executing"] == 3  # executing + long-running
    assert (detail["n_workers"], detail["cores"], detail["memory"]) == (2, 3, 600_000_000)
    assert detail["owner_pid"] == 4242 and detail["owns_cluster"] is True
    # the owner's kernel first, then the attached ones: the panel follows either notebook here
    assert detail["kernels"] == ["5f0c2a9e-1b7d-4c1e-9a43-2f6e8d0b7c11", "9d3e7b21-0000-4000-8000-000000000002"]
    assert [j["job"] for j in p["jobs"]["running"]] == ["job-1"]
    assert set(p["metrics"]["scalars"]["reward"]) == {"member=0", "member=1"}
    assert p["metrics"]["vectors"]["load"]["all"]["rows"] == [[1.0, 0.0, 4.0]]


def test_shared_checks():
    assert models.validate_name("a-1.b_c") == "a-1.b_c"
    for bad in ("", "-a", "a b", "x" * 64, 3, None):
        with pytest.raises(ClusterError, match="not a valid cluster name"):
            models.validate_name(bad)
    assert models.validate_count(0, "workers") == 0
    for bad in (-1, True, 1.5, models.MAX_WORKERS + 1):
        with pytest.raises(ClusterError, match="workers must be a whole number"):
            models.validate_count(bad, "workers")
    with pytest.raises(ClusterError, match="from 1 to"):
        models.validate_count(0, "threads", minimum=1)


def _running(handle) -> list[int]:
    """The running tasks of each worker row, as the panel gets them (``cluster_model`` of the scheduler's identity)."""
    return [w["executing"] for w in handle.model()["workers"]]


def _executing_keys(dask_worker=None) -> list[str]:
    """The tasks a worker runs in its threads, as the worker itself sees them (run with ``client.run``)."""
    return sorted(str(ts.key) for ts in dask_worker.state.executing)


def test_worker_rows_count_a_maps_leases_as_running_tasks(cluster, tmp_path):
    """Issue 13: a map's leases are visible as running in our panel, and leave it once they end."""
    client = cluster.client
    # The cluster start's warm-up tasks, then earlier maps' idle leases (kept engine.linger), would count too.
    wait_for(
        lambda: getattr(client, "_jc_warmed", None) or getattr(client, "_jc_warm_error", None),
        timeout=60,
        message="the start's warm-up to end",
    )
    engine_dask.release_leases(client)
    wait_for(lambda: not any(client.processing().values()), timeout=30, message="no task left on the scheduler")
    wait_for(lambda: _running(cluster) == [0, 0], timeout=30, message="no task running in the worker rows")
    flag = str(tmp_path / "go")
    seen, errors = [], []

    def watch():
        # While every item waits for the flag, the 2 workers (1 thread each) run nothing but the leases.
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                rows = cluster.model()["workers"]
                if [w["executing"] for w in rows] == [1, 1]:
                    seen.append((rows, client.run(_executing_keys)))
                    return
                time.sleep(0.05)
        except BaseException as e:
            errors.append(e)
        finally:
            open(flag, "w").close()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    out = mapping.map(functools.partial(gated_square, flag), range(100, 104), client=cluster, progress=False)
    watcher.join(10)
    assert not errors, errors
    assert out == [x * x for x in range(100, 104)]
    assert seen, "the worker rows never showed one running task per worker thread while the map ran"
    job = mapping.last_job()
    assert_ran_on_leases(job)
    assert job.leases == 2
    rows, executing = seen[0]
    # What the rows counted were this map's leases: each worker's thread ran one, and nothing else.
    assert sorted(executing) == sorted(w["address"] for w in rows)
    assert all(len(keys) == 1 and keys[0].startswith(f"jc-lease-{job.id}-") for keys in executing.values()), executing
    # Released (a cluster's close does this first), they leave the rows.
    engine_dask.release_leases(client)
    wait_for(lambda: _running(cluster) == [0, 0], timeout=30, message="the released leases to leave the worker rows")


def _tool(name: str) -> str:
    return os.path.join(ROOT, "node_modules", ".bin", name)


def _write_fixture() -> tuple[str | None, str]:
    """Write the builders' payloads as the fixture the TypeScript tests read; (what it held, what it holds)."""
    text = json.dumps(payloads(), indent=2, sort_keys=True) + "\n"
    os.makedirs(os.path.dirname(FIXTURE), exist_ok=True)
    old = open(FIXTURE).read() if os.path.exists(FIXTURE) else None
    if old != text:
        with open(FIXTURE, "w") as f:
            f.write(text)
    return old, text


def test_the_fixture_the_typescript_reads_holds_the_builders_payloads():
    """The fast layer's half: the TypeScript side reads the fixture in ``make lint`` (tsc, tsconfig.test.json)
    and in Jest's contract.spec.ts (tests/packaging/test_labextension.py), so it must be today's payloads."""
    old, text = _write_fixture()
    assert old == text, "the Python builders' payloads changed: wire.json was rewritten; commit it with the change"


# The same tsc and Jest run in the fast layer, from `make lint` and tests/packaging/test_labextension.py
@pytest.mark.slow
def test_typescript_reads_the_builders_payloads():
    """Write the fixture, then tsc type-checks it against messages.ts and Jest feeds it to the reducers."""
    old, text = _write_fixture()
    if not (os.path.exists(_tool("tsc")) and os.path.exists(_tool("jest")) and shutil.which("node")):
        pytest.fail("node_modules has no tsc/jest; run `make setup` (jlpm install) first.")
    env = dict(os.environ, PATH=os.path.dirname(shutil.which("node")) + os.pathsep + os.environ.get("PATH", ""))
    tsc = subprocess.run(
        [_tool("tsc"), "--noEmit", "-p", "tsconfig.test.json"], cwd=ROOT, capture_output=True, text=True, env=env
    )
    assert tsc.returncode == 0, "messages.ts and the Python builders disagree:\n" + tsc.stdout + tsc.stderr
    jest = subprocess.run(
        [_tool("jest"), "--ci", "contract"], cwd=ROOT, capture_output=True, text=True, env=env, timeout=240
    )
    assert jest.returncode == 0, jest.stdout[-4000:] + jest.stderr[-4000:]
    assert old == text, "the Python builders' payloads changed: wire.json was rewritten; commit it with the change"


@pytest.mark.parametrize(
    "value, dask",
    [("2GiB", False), ("auto", False), (1, False), (2**63 - 1, False), ("1e3", False), (0, True), ("0", True)]
    + [(0.5, True), (2e9, True), ("4 GB", True)],
)
def test_validate_size_takes_sizes(value, dask):
    assert models.validate_size(value, "memory_limit", dask=dask) == value


@pytest.mark.parametrize(
    "value",
    ["1e999GB", "inf", "nanGB", "-1GB", "", "GiB", "lots", "9" * 40, -1, 0, 2**63, 10**400, 2.5, True, None, [], {}],
)
def test_validate_size_refuses_what_is_no_size_in_one_sentence(value):
    with pytest.raises(ClusterError) as info:
        models.validate_size(value, "memory_limit")
    text = str(info.value)
    assert text.startswith('memory_limit must be a size such as "2GiB"') and text.endswith(".") and ". " not in text
    assert len(text) < 140  # the value is clipped
