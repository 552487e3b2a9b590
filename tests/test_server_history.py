"""What the server keeps of a stopped cluster (server/history.py): the snapshot, its
files on disk, their bound and their deletion.  No browser: the browser test
(tests/ui/test_panel.py) shows the same history in the panel, across a server restart.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from jupyter_cluster import registry
from jupyter_cluster.server.history import HistoryFolder, KeptCluster
from jupyter_cluster.server.manager import PANEL_MODEL, Connection
from jupyter_cluster.telemetry.store import TopicStore


def _stopped_connection(name: str = "c1") -> Connection:
    """A real Connection (never connected) holding one finished and one running job and one topic."""
    conn = Connection(registry.ClusterRecord(name=name, backend="local", address="tcp://127.0.0.1:1"))
    now = time.time()
    for job, state in (("j1", "finished"), ("j2", "running")):
        conn.jobs.add(
            {
                "job": job,
                "label": "evaluate",
                "total": 4,
                "done": 4,
                "failed": 0,
                "state": state,
                "cluster": name,
                "started": now,
                "updated": now,
            }
        )
    store = TopicStore("es")
    store.add(
        "src",
        0,
        [
            {
                "step": s,
                "time": now,
                "series": {"walk": f"walk {w}"},
                "values": {"reward": float(s * w), "load": [s, w]},
            }
            for s in range(3)
            for w in range(2)
        ],
    )
    conn.metrics["es"] = store
    return conn


def test_snapshot_serves_the_panel_reads_and_marks_running_jobs_lost():
    kept = KeptCluster.from_connection("c1.stopped-120000", _stopped_connection(), PANEL_MODEL)
    summary = kept.summary()
    assert summary["name"] == "c1.stopped-120000" and summary["cluster"] == "c1"
    assert summary["status"] == "stopped" and summary["topics"] == ["es"]
    states = {j["job"]: j["state"] for j in kept.jobs.snapshot()["recent"]}
    assert states == {"j1": "finished", "j2": "lost"}
    topic = kept.metrics["es"]
    assert topic.received == 6 and topic.series == {"walk=walk 0", "walk=walk 1"}
    assert topic.model()["scalars"]["reward"]["walk=walk 1"] == [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]


def test_files_round_trip_are_bounded_and_deleted(tmp_path):
    folder = HistoryFolder(str(tmp_path), keep=2)
    saved = {}
    for i in range(3):
        kept = KeptCluster.from_connection(f"c{i}.stopped-1200{i:02d}", _stopped_connection(f"c{i}"), PANEL_MODEL)
        assert folder.save(kept)
        saved[kept.key] = kept.metrics["es"].model()
        os.utime(os.path.join(tmp_path, f"{kept.key}.json"), (i + 1, i + 1))  # distinct ages
    loaded = folder.load()
    assert [k.key for k in loaded] == ["c1.stopped-120001", "c2.stopped-120002"]  # the oldest went
    # points and report times come back as they were
    assert loaded[1].metrics["es"].model() == saved["c2.stopped-120002"]
    folder.delete("c1.stopped-120001")
    assert [k.key for k in folder.load()] == ["c2.stopped-120002"]


def test_too_large_or_unreadable_files_are_skipped(tmp_path):
    kept = KeptCluster.from_connection("big.stopped-1", _stopped_connection("big"), PANEL_MODEL)
    assert not HistoryFolder(str(tmp_path), max_bytes=100).save(kept)
    assert not os.listdir(tmp_path)
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "old.json").write_text(json.dumps({"format": 1}))
    assert HistoryFolder(str(tmp_path)).load() == []


# -- running clusters: kept on disk, taken up again by a restarted server -------------------
def test_a_store_snapshot_restores_its_points_and_drops_reports_it_had_seen():
    conn = _stopped_connection()
    store = conn.metrics["es"]
    snap = json.loads(json.dumps(store.snapshot(**PANEL_MODEL)))  # as it goes through the file
    again = TopicStore.restore(snap)
    assert again.model(**PANEL_MODEL) == store.model(**PANEL_MODEL)
    assert again.received == 6 and again.dropped == 0
    # the scheduler's backlog sends the same reports to the restarted server: none is counted twice
    now = time.time()
    replay = [
        {"step": s, "time": now, "series": {"walk": f"walk {w}"}, "values": {"reward": float(s * w), "load": [s, w]}}
        for s in range(3)
        for w in range(2)
    ]
    assert again.add("src", 0, replay) == 0
    # a new report after the backlog is added where it belongs
    assert again.add("src", 6, [{"step": 3, "time": now, "series": {"walk": "walk 1"}, "values": {"reward": 9.0}}]) == 1
    assert again.model()["scalars"]["reward"]["walk=walk 1"][-1] == [3.0, 9.0]
    assert again.received == 7
    with pytest.raises(ValueError, match="not a metrics snapshot"):
        TopicStore.restore({"model": {"scalars": 3}})


def test_a_restarted_manager_takes_up_a_running_cluster_and_keeps_a_gone_one_as_history(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    from jupyter_cluster.server.manager import ClusterManager

    first = ClusterManager()
    running = _stopped_connection("still-running")
    gone = _stopped_connection("gone-meanwhile")
    first.connections = {c.name: c for c in (running, gone)}
    assert first.save_live(force=True) == 2
    assert first.save_live() == 0  # nothing changed since: nothing written again
    assert sorted(os.listdir(tmp_path / "jupyter-cluster-live")) == ["gone-meanwhile.json", "still-running.json"]

    second = ClusterManager()
    # the registry lists only the running one now (same record), so only it is taken up
    fresh = Connection(running.record)
    second._take_up(fresh)
    assert {j["job"] for j in fresh.jobs.jobs.values()} == {"j1", "j2"}
    assert fresh.metrics["es"].model(**PANEL_MODEL) == running.metrics["es"].model(**PANEL_MODEL)
    # a cluster of the same name started anew is not given the old one's curves
    other = Connection(registry.ClusterRecord(name="gone-meanwhile", backend="local", address="tcp://127.0.0.1:2"))
    second._take_up(other)
    assert not other.metrics and not other.jobs.jobs
    kept = [k for k in second.history.values() if k.name == "gone-meanwhile"]
    assert len(kept) == 1 and kept[0].key.startswith("gone-meanwhile.stopped-")
    assert {j["job"]: j["state"] for j in kept[0].jobs.jobs.values()} == {"j1": "finished", "j2": "lost"}
    assert kept[0].metrics["es"].received == 6
    assert os.listdir(tmp_path / "jupyter-cluster-live") == ["still-running.json"]


async def test_a_kept_cluster_serves_reads_and_refuses_actions(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    from jupyter_cluster.errors import ClusterError
    from jupyter_cluster.server.manager import ClusterManager

    manager = ClusterManager()
    kept = KeptCluster.from_connection("c1.stopped-120000", _stopped_connection(), PANEL_MODEL)
    manager.history[kept.key] = kept
    assert [t["topic"] for t in manager.topics(kept.key)] == ["es"]
    model = manager.metrics(kept.key, "es")
    assert model["version"] == 1 and sorted(model["scalars"]["reward"]) == ["walk=walk 0", "walk=walk 1"]
    with pytest.raises(ClusterError, match="'c1' has stopped; there is nothing to scale"):
        await manager.scale(kept.key, 2)
    with pytest.raises(ClusterError, match="'c1' has stopped; there is nothing to adapt"):
        await manager.adapt(kept.key, 0, 2)
    with pytest.raises(ClusterError, match="kept as 'c1.stopped-120000'"):
        await manager.cluster(kept.key)


def test_running_clusters_keep_their_jobs_and_curves_across_a_real_server_restart(tmp_path):
    """A real Jupyter server, stopped and started again while a cluster keeps running.

    The scheduler keeps only its last 3 events per topic here, so what the
    restarted server shows of the early reports and the early job can only
    come from what the first server wrote on its way down.  Then the cluster
    stops while no server runs: the next server keeps it as history.
    """
    import dask
    import requests

    import jupyter_cluster as jc
    from jupyter_cluster import telemetry

    from .conftest import wait_for
    from .jupyter_process import JupyterProcess

    with dask.config.set({"distributed.admin.low-level-log-length": 3}):
        handle = jc.start(workers=1, threads=1)
    name = handle.name
    server = JupyterProcess(str(tmp_path), app="server").start(timeout=120)

    def get(path: str):
        r = requests.get(server.api(path), headers=server.headers, timeout=10)
        r.raise_for_status()
        return r.json()

    def status() -> str:
        return next((c["status"] for c in get("clusters")["clusters"] if c["name"] == name), "")

    def report(i: int) -> int:
        import jupyter_cluster

        jupyter_cluster.report(step=i, topic="kept", reward=float(i))
        return i

    try:
        wait_for(lambda: status() == "running", 30, interval=0.2, message="the server to connect")
        now = time.time()
        early = {"job": "early", "label": "evaluate", "kernel": os.getpid(), "total": 1, "done": 1, "failed": 0}
        handle.client.log_event(telemetry.JOBS_TOPIC, dict(early, state="finished", started=now, updated=now))
        for i in range(12):  # one event each: far more than the scheduler keeps
            assert handle.client.submit(report, i, pure=False).result(timeout=30) == i
            time.sleep(0.12)
        for j in range(4):
            handle.client.log_event(
                telemetry.JOBS_TOPIC, dict(early, job=f"late-{j}", state="finished", started=now, updated=time.time())
            )
        wait_for(lambda: get(f"clusters/{name}/metrics/kept")["received"] == 12, 30, interval=0.2, message="12 reports")
        wait_for(lambda: len(get(f"jobs?cluster={name}")["recent"]) == 5, 15, interval=0.2, message="5 jobs")
        server.stop()
        assert os.path.exists(os.path.join(os.environ["JUPYTER_RUNTIME_DIR"], "jupyter-cluster-live", f"{name}.json"))
        # while no server runs, one more report: it reaches the restarted server from the backlog
        handle.client.submit(report, 12, pure=False).result(timeout=30)

        server.start(timeout=120)
        wait_for(lambda: status() == "running", 30, interval=0.2, message="the restarted server to connect")
        model = wait_for(
            lambda: (m := get(f"clusters/{name}/metrics/kept"))["received"] == 13 and m,
            30,
            interval=0.2,
            message="the 12 kept reports and the new one",
        )
        assert [p[0] for p in model["scalars"]["reward"]["all"]] == list(range(13))
        assert model["dropped"] == 0
        assert "early" in {j["job"] for j in get(f"jobs?cluster={name}")["recent"]}

        # the cluster stops while no server runs: the next one keeps what was written as history
        server.stop()
        jc.stop(name)
        server.start(timeout=120)
        history = wait_for(
            lambda: [h for h in get("jobs")["history"] if h["cluster"] == name], 30, interval=0.2, message="history"
        )
        kept = get(f"clusters/{history[0]['name']}/metrics/kept")
        assert [p[0] for p in kept["scalars"]["reward"]["all"]] == list(range(13))
    finally:
        server.stop()
        if registry.read(name) is not None:
            jc.stop(name)


def test_a_kept_running_cluster_under_a_name_that_is_no_cluster_name_is_ignored(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    from jupyter_cluster.server.manager import ClusterManager

    live = tmp_path / "jupyter-cluster-live"
    live.mkdir()
    outside = tmp_path / "victim.json"
    outside.write_text("{}")
    (live / "planted.json").write_text(json.dumps({"format": 1, "key": "../victim", "jobs": [], "topics": []}))
    manager = ClusterManager()
    assert manager._waiting == {}
    assert outside.exists()
