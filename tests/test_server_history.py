"""What the server keeps of a stopped cluster (server/jobs.py): the snapshot, its
files on disk, their bound and their deletion.  No browser: the browser test
(tests/ui/test_panel.py) shows the same history in the panel, across a server restart.
"""

from __future__ import annotations

import json
import os
import time

from jupyter_cluster import registry
from jupyter_cluster.server.jobs import HistoryFolder, KeptCluster
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
