"""What the server keeps of a stopped cluster (server/history.py): the snapshot, its
files on disk, their bound and their deletion.  No browser: the browser test
(tests/ui/test_panel.py) shows the same history in the panel, across a server restart.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from jupyter_cluster.server.connection import Connection
from jupyter_cluster.server.history import HistoryFolder, KeptCluster
from jupyter_cluster.state import registry
from jupyter_cluster.telemetry.topic_store import PANEL_MODEL, TopicStore


def _write(path, text: str) -> None:
    """A file as the server writes them: this user's, mode 0600 (others' and links are never read)."""
    path.write_text(text)
    path.chmod(0o600)


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
        assert folder.save(kept) in ([], ["c0.stopped-120000"])  # keep=2: the third save gives up the oldest
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
    assert HistoryFolder(str(tmp_path), max_bytes=100).save(kept) == [kept.key]  # not written
    assert not os.listdir(tmp_path)
    _write(tmp_path / "broken.json", "{not json")
    _write(tmp_path / "old.json", json.dumps({"format": 1}))
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

    from ..conftest import wait_for
    from ..jupyter_process import JupyterProcess

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
    _write(live / "planted.json", json.dumps({"format": 1, "key": "../victim", "jobs": [], "topics": []}))
    manager = ClusterManager()
    assert manager._waiting == {}
    assert outside.exists()


# -- damaged files (issue 25.6) ------------------------------------------------------------
def _kept_json(key: str) -> dict:
    return json.loads(
        json.dumps(KeptCluster.from_connection(key, _stopped_connection(key.split(".")[0]), PANEL_MODEL).to_json())
    )


def _damaged(good: dict, path: tuple, value) -> dict:
    """A copy of ``good`` with the value at ``path`` (keys and list indices) replaced."""
    data = json.loads(json.dumps(good))
    at = data
    for step in path[:-1]:
        at = at[step]
    at[path[-1]] = value
    return data


def _damaged_kept_files(good: dict) -> dict[str, str]:
    """One file per malformed shape, at every level of a kept cluster's JSON (name -> text)."""
    shapes = {
        "topics-str": (("topics",), ["str"]),  # the issue's: AttributeError in ClusterManager.__init__
        "scalars-list": (("topics", 0, "scalars"), [1, 2]),  # the other one
        "topics-dict": (("topics",), {"a": 1}),
        "topic-name-int": (("topics", 0, "topic"), 3),
        "series-list": (("topics", 0, "scalars", "reward"), [[0, 1]]),
        "points-dict": (("topics", 0, "scalars", "reward", "walk=walk 0"), {"0": 1}),
        "point-str": (("topics", 0, "scalars", "reward", "walk=walk 0", 0), ["a", 1]),
        "point-short": (("topics", 0, "scalars", "reward", "walk=walk 0", 0), [1]),
        "vectors-list": (("topics", 0, "vectors"), ["load"]),
        "vector-rows-str": (("topics", 0, "vectors", "load", "walk=walk 0", "rows"), "x"),
        "vector-row-values": (("topics", 0, "vectors", "load", "walk=walk 0", "rows", 0), [{"x": 1}]),
        "times-short": (("topics", 0, "times", "walk=walk 0"), [[1]]),
        "received-str": (("topics", 0, "received"), "many"),
        "summary-list": (("summary",), []),
        "summary-workers-str": (("summary", "n_workers"), "2"),
        "jobs-dict": (("jobs",), {"j1": {}}),
        "job-str": (("jobs", 0), "j1"),
        "key-int": (("key",), 7),
    }
    files = {name: json.dumps(_damaged(good, *shape)) for name, shape in shapes.items()}
    files.update(
        {
            "not-json": "{not json",
            "json-list": "[1, 2]",
            "json-null": "null",
            "json-str": '"kept"',
            "too-deep": "[" * 100_000 + "]" * 100_000,
            "empty": "",
        }
    )
    return files


def _plant(folder, files: dict[str, str], binary: bool = True) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, (name, text) in enumerate(files.items()):
        path = folder / f"{name}.json"
        _write(path, text)
        os.utime(path, (1000 + i, 1000 + i))  # newer than the good file (mtime 10)
        paths.append(str(path))
    if binary:
        (folder / "not-utf8.json").write_bytes(b'{"key": "\xff\xfe"}')
        (folder / "not-utf8.json").chmod(0o600)
        os.utime(folder / "not-utf8.json", (999, 999))
        paths.append(str(folder / "not-utf8.json"))
    return paths


def test_each_damaged_history_file_is_skipped_with_one_warning_naming_it(tmp_path, monkeypatch, caplog):
    """A malformed file raised AttributeError from ClusterManager(): Jupyter dropped the whole extension."""
    import logging

    from jupyter_cluster.server.manager import ClusterManager

    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    good = _kept_json("good.stopped-120000")
    history = tmp_path / "jupyter-cluster-history"
    history.mkdir()
    _write(history / "good.stopped-120000.json", json.dumps(good))
    os.utime(history / "good.stopped-120000.json", (10, 10))  # the oldest, behind many damaged files
    bad = _plant(history, _damaged_kept_files(good))
    assert len(bad) > 8  # more than the count the history once kept

    live_good = json.loads(json.dumps(live_snapshot_of("still-running")))
    live = tmp_path / "jupyter-cluster-live"
    live.mkdir()
    _write(live / "still-running.json", json.dumps(live_good))
    os.utime(live / "still-running.json", (10, 10))
    live_bad = _plant(
        live,
        {
            "live-list": "[]",
            "live-record-list": json.dumps(_damaged(live_good, ("record",), [1])),
            "live-jobs-int": json.dumps(_damaged(live_good, ("jobs",), 5)),
            "live-topics-str": json.dumps(_damaged(live_good, ("topics",), ["str"])),
            "live-summary-str": json.dumps(_damaged(live_good, ("summary",), "s")),
            "live-saved-str": json.dumps(_damaged(live_good, ("saved",), "yesterday")),
            "live-key-list": json.dumps(_damaged(live_good, ("key",), ["a"])),
        },
        binary=False,
    )

    with caplog.at_level(logging.WARNING, logger="jupyter_cluster.server.history"):
        manager = ClusterManager()
    assert list(manager.history) == ["good.stopped-120000"]
    kept = manager.history["good.stopped-120000"]
    assert manager.metrics("good.stopped-120000", "es")["scalars"] == good["topics"][0]["scalars"]
    assert {j["job"] for j in kept.jobs.jobs.values()} == {"j1", "j2"}
    assert list(manager._waiting or {}) == ["still-running"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for path in bad + live_bad:
        assert sum(path in w for w in warnings) == 1, (path, warnings)
    assert len(warnings) == len(bad) + len(live_bad)
    assert all(os.path.exists(p) for p in bad)  # kept for the user to look at, not deleted


def live_snapshot_of(name: str) -> dict:
    from jupyter_cluster.server.history import live_snapshot

    return live_snapshot(_stopped_connection(name), PANEL_MODEL)


def test_a_damaged_kept_topic_of_a_gone_cluster_is_left_out_with_a_warning(tmp_path, monkeypatch, caplog):
    """A running cluster's file whose topic model is damaged, for a cluster gone meanwhile: history is not poisoned."""
    import logging

    from jupyter_cluster.server.manager import ClusterManager

    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    live = tmp_path / "jupyter-cluster-live"
    live.mkdir()
    snap = json.loads(json.dumps(live_snapshot_of("gone")))
    snap["topics"][0]["model"]["scalars"] = ["str"]
    snap["saved"] = 1e300  # no clock shows it: time.localtime raised OverflowError
    _write(live / "gone.json", json.dumps(snap))
    manager = ClusterManager()
    with caplog.at_level(logging.WARNING, logger="jupyter_cluster.server.snapshots"):
        manager._keep_live(manager._waiting.pop("gone"))
    assert manager.history == {}
    assert any("gone" in r.getMessage() and "unreadable" in r.getMessage() for r in caplog.records)
    assert not (live / "gone.json").exists()


def test_a_real_server_with_damaged_history_files_serves_its_routes_and_the_good_history(tmp_path, monkeypatch):
    """Before, every route of the extension answered 404 on every start until the file was deleted by hand."""
    import requests

    from ..jupyter_process import JupyterProcess

    runtime = tmp_path / "runtime"
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(runtime))
    good = _kept_json("good.stopped-120000")
    history = runtime / "jupyter-cluster-history"
    history.mkdir(parents=True)
    _write(history / "good.stopped-120000.json", json.dumps(good))
    os.utime(history / "good.stopped-120000.json", (10, 10))
    damaged = _damaged_kept_files(good)
    bad = _plant(history, {k: damaged[k] for k in ("topics-str", "scalars-list", "json-list", "not-json")})
    os.mkfifo(history / "fifo.stopped-1.json", 0o600)  # once hung the server's start (issue 37.7)
    bad.append(str(history / "fifo.stopped-1.json"))
    root = tmp_path / "root"
    root.mkdir()
    server = JupyterProcess(str(root), app="server").start(timeout=120)
    try:
        r = requests.get(server.api("clusters"), headers=server.headers, timeout=30)
        assert r.status_code == 200, r.text
        jobs = requests.get(server.api("jobs"), headers=server.headers, timeout=30).json()
        assert [h["name"] for h in jobs["history"]] == ["good.stopped-120000"]
        model = requests.get(server.api("clusters/good.stopped-120000/metrics/es"), headers=server.headers, timeout=30)
        assert model.status_code == 200 and model.json()["scalars"] == good["topics"][0]["scalars"]
    finally:
        server.stop()
    log = server.log_tail(400)
    for path in bad:
        assert log.count(path) == 1, (path, log)


# -- bounded by size on disk, per notebook; unique names ----------------------------------------
def _notebook_connection(name: str, notebook: str, jobs: int = 1, pad: int = 0) -> Connection:
    """A real Connection whose finished jobs came from ``notebook`` (``pad`` bytes of label each)."""
    conn = Connection(registry.ClusterRecord(name=name, backend="local", address="tcp://127.0.0.1:1"))
    now = time.time()
    for i in range(jobs):
        conn.jobs.add(
            {"job": f"{name}-{i}", "label": "x" * pad or "map", "total": 1, "done": 1, "failed": 0,
             "state": "finished", "cluster": name, "started": now, "updated": now + i, "notebook": notebook}
        )  # fmt: skip
    return conn


def test_history_is_bounded_by_size_per_notebook_and_a_flood_evicts_only_its_own(tmp_path):
    one = KeptCluster.from_connection("probe", _notebook_connection("probe", "flood.ipynb", pad=150), PANEL_MODEL)
    size = len(json.dumps(one.to_json(), separators=(",", ":")))
    folder = HistoryFolder(str(tmp_path), owner_bytes=4 * size, total_bytes=8 * size)
    quiet = [
        KeptCluster.from_connection(f"{nb}-1.stopped-1", _notebook_connection(f"{nb}-1", f"{nb}.ipynb"), PANEL_MODEL)
        for nb in ("a", "b")
    ]
    for kept in quiet:
        assert folder.save(kept) == []
    assert quiet[0].owner == "notebook:a.ipynb"
    for i in range(20):  # a third notebook keeps stopping clusters
        kept = KeptCluster.from_connection(
            f"f{i}.stopped-1", _notebook_connection(f"f{i}", "flood.ipynb", pad=150), PANEL_MODEL
        )
        removed = folder.save(kept)
        assert kept.key not in removed and not any(k.startswith(("a-", "b-")) for k in removed)
        os.utime(tmp_path / f"{kept.key}.json", (100 + i, 100 + i))  # distinct ages (mtime: oldest first)
    on_disk = sorted(p.name for p in tmp_path.iterdir())
    assert "a-1.stopped-1.json" in on_disk and "b-1.stopped-1.json" in on_disk
    usage = folder.usage()
    assert usage["notebook:flood.ipynb"] <= 4 * size and sum(usage.values()) <= 8 * size
    flood = [n for n in on_disk if n.startswith("f")]
    assert 1 <= len(flood) <= 4 and "f19.stopped-1.json" in flood  # the newest stay
    # a server that starts later reads every file, with the owners they were written with
    again = HistoryFolder(str(tmp_path), owner_bytes=4 * size, total_bytes=8 * size)
    assert {k.key for k in again.load()} == {n[: -len(".json")] for n in on_disk}
    assert again.usage() == usage
    assert all(os.stat(tmp_path / n).st_mode & 0o777 == 0o600 for n in on_disk)


def test_files_the_history_refuses_to_read_are_neither_counted_nor_deleted(tmp_path):
    """Issue 37.5 and 7: a 150 MB unreadable crash.json counted against the budget and pushed out another
    notebook's files; refused files (another user's, links, a damaged one of the user's own) were deleted;
    a FIFO named ``*.json`` hung every read of the folder."""
    import stat
    import threading

    from jupyter_cluster.tracking.kept import kept_runs

    one = KeptCluster.from_connection("probe", _notebook_connection("probe", "a.ipynb", pad=150), PANEL_MODEL)
    size = len(json.dumps(one.to_json(), separators=(",", ":")))
    total = 8 * size
    a_files = []
    first = HistoryFolder(str(tmp_path), owner_bytes=4 * size, total_bytes=total)
    for i in range(3):
        kept = KeptCluster.from_connection(f"a{i}.stopped-1", _notebook_connection(f"a{i}", "a.ipynb"), PANEL_MODEL)
        assert first.save(kept) == []
        os.utime(tmp_path / f"{kept.key}.json", (100 + i, 100 + i))
        a_files.append(f"{kept.key}.json")
    # larger than the whole budget, the user's own, not JSON: kept to look at (as the docs say), never counted
    crash = tmp_path / "crash.json"
    with open(crash, "wb") as f:
        f.write(b"\x00not json" * (2 * total // 10))
    crash.chmod(0o600)
    os.utime(crash, (50, 50))
    refused = ["crash.json"]
    for n in range(2):  # several damaged ones: once counted as one owner "?", its oldest went
        _write(tmp_path / f"damaged{n}.json", '{"key": 1}' + " " * size)
        os.utime(tmp_path / f"damaged{n}.json", (60 + n, 60 + n))
        refused.append(f"damaged{n}.json")
    theirs = tmp_path / "theirs.stopped-1.json"
    _write(theirs, (tmp_path / a_files[0]).read_text() + " " * size)
    os.chown(theirs, 65534, 65534)  # another user's (the tests run as root, as CI does)
    os.utime(theirs, (70, 70))
    elsewhere = tmp_path.parent / f"{tmp_path.name}-elsewhere.json"
    _write(elsewhere, (tmp_path / a_files[1]).read_text())
    (tmp_path / "link.stopped-1.json").symlink_to(elsewhere)
    os.mkfifo(tmp_path / "fifo.json", 0o600)
    refused += ["theirs.stopped-1.json", "link.stopped-1.json", "fifo.json"]

    # a new server reads the folder (a FIFO once made this wait for a writer forever)
    result: dict = {}
    reader = threading.Thread(target=lambda: result.update(kept=HistoryFolder(str(tmp_path)).load()), daemon=True)
    reader.start()
    reader.join(30)
    assert not reader.is_alive(), "reading the history folder hangs on a FIFO"
    assert sorted(k.key for k in result["kept"]) == ["a0.stopped-1", "a1.stopped-1", "a2.stopped-1"]
    runs: dict = {}
    reader = threading.Thread(target=lambda: runs.update(r=kept_runs("a.ipynb", folder=str(tmp_path))), daemon=True)
    reader.start()
    reader.join(30)
    assert not reader.is_alive(), "jc.runs()'s read of the history folder hangs on a FIFO"

    # notebook C stops a cluster: within the budget once refused files are left out, so nothing goes
    folder = HistoryFolder(str(tmp_path), owner_bytes=4 * size, total_bytes=total)
    folder.load()
    kept = KeptCluster.from_connection("c0.stopped-1", _notebook_connection("c0", "c.ipynb"), PANEL_MODEL)
    assert folder.save(kept) == []
    on_disk = set(os.listdir(tmp_path))
    assert set(a_files) <= on_disk, on_disk
    assert (
        set(refused) <= on_disk
        and os.path.exists(elsewhere)
        and stat.S_ISFIFO(os.lstat(tmp_path / "fifo.json").st_mode)
    )
    assert sum(folder.usage().values()) <= total
    # over budget for real: only files it read as the user's go, never a refused one
    for i in range(12):
        kept = KeptCluster.from_connection(
            f"c{i + 1}.stopped-1", _notebook_connection(f"c{i + 1}", "c.ipynb", pad=150), PANEL_MODEL
        )
        removed = folder.save(kept)
        assert not set(refused) & {f"{k}.json" for k in removed}, removed
        os.utime(tmp_path / f"{kept.key}.json", (200 + i, 200 + i))
    on_disk = set(os.listdir(tmp_path))
    assert set(refused) <= on_disk and set(a_files) <= on_disk, on_disk
    assert sum(folder.usage().values()) <= total


def test_kept_clusters_have_unique_keys_and_titles(tmp_path, monkeypatch):
    from jupyter_cluster.server.manager import ClusterManager

    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    manager = ClusterManager()
    when = time.localtime()
    keys = []
    for _ in range(3):  # "local-1" three times, stopped in the same second
        key = manager._history_key("local-1", when)
        manager._keep(
            KeptCluster.from_connection(key, _notebook_connection("local-1", "nb/02-sweep.ipynb"), PANEL_MODEL)
        )
        keys.append(key)
    assert len(set(keys)) == 3
    titles = [h["title"] for h in manager.history_list()]
    assert len(set(titles)) == 3, titles
    assert all("local-1 · 02-sweep.ipynb · " in t for t in titles) and any(t.endswith("(3)") for t in titles)
    # a restarted server knows the keys on disk: a new one never takes an old one's name
    again = ClusterManager()
    assert again._history_key("local-1", when) not in keys
    assert sorted(h["title"] for h in again.history_list()) == sorted(titles)
    assert again.history_list()[0]["notebooks"] == ["nb/02-sweep.ipynb"]


# -- a cluster that comes and goes between two scans ------------------------------------------
QUICK_SCRIPT = """
import sys, time
import jupyter_cluster as jc

t0 = time.monotonic()
handle = jc.start(name=sys.argv[1], workers=1, threads=1, processes=False)
assert jc.map(lambda x: 2 * x, range(4)) == [0, 2, 4, 6]
handle.stop()
print(round(time.monotonic() - t0, 2), flush=True)
"""


def test_a_cluster_started_mapped_and_stopped_between_two_scans_is_kept(tmp_path):
    """A real server that never followed the cluster still lists its history, jobs and runs.

    The server is held (SIGSTOP) while a client process starts a cluster,
    runs one map and stops it, so no registry scan can see it: before the
    owner left its final word, nothing of it reached the server.  A final
    word that others could read is refused and left alone.
    """
    import signal
    import subprocess
    import sys

    import requests

    from ..conftest import wait_for
    from ..jupyter_process import JupyterProcess

    server = JupyterProcess(str(tmp_path), app="server").start(timeout=120)
    planted = os.path.join(registry.registry_dir(), "ghost@1-1.final")
    try:
        with open(planted, "w") as f:
            json.dump({"key": "ghost", "record": {}, "summary": {}, "jobs": [{"job": "g", "state": "finished"}]}, f)
        os.chmod(planted, 0o644)
        assert server.proc is not None
        server.proc.send_signal(signal.SIGSTOP)
        try:
            out = subprocess.run(
                [sys.executable, "-c", QUICK_SCRIPT, "quick-1"], capture_output=True, text=True, timeout=120
            )
        finally:
            server.proc.send_signal(signal.SIGCONT)
        assert out.returncode == 0, out.stderr
        assert registry.read("quick-1") is None

        def get(path: str) -> dict:
            r = requests.get(server.api(path), headers=server.headers, timeout=30)
            r.raise_for_status()
            return r.json()

        history = wait_for(
            lambda: [h for h in get("jobs")["history"] if h["cluster"] == "quick-1"],
            30,
            interval=0.2,
            message="history",
        )
        assert len(history) == 1 and history[0]["status"] == "stopped" and history[0]["backend"] == "local"
        jobs = get("jobs?cluster=" + history[0]["name"])["recent"]
        assert [(j["state"], j["total"], j["done"]) for j in jobs] == [("finished", 4, 4)]
        runs = [r for r in get("runs")["runs"] if r["cluster"] == "quick-1"]
        assert len(runs) == 1 and runs[0]["history"] == history[0]["name"] and runs[0]["done"] == 4
        assert not [p for p in os.listdir(registry.registry_dir()) if p.startswith("quick-1@")]  # taken up: gone
        assert os.path.exists(planted)  # another's (readable by others): never read, left alone
        assert not [h for h in get("jobs")["history"] if h["cluster"] == "ghost"]
    finally:
        server.stop()
        os.remove(planted)


def test_jobs_version_never_goes_down_when_a_cluster_stops(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    from jupyter_cluster.server.manager import ClusterManager

    manager = ClusterManager()
    seen = [manager.jobs_version(), manager.runs_version()]
    conn = _stopped_connection("v1")
    manager.connections["v1"] = conn
    seen += [manager.jobs_version(), manager.runs_version()]
    del manager.connections["v1"]  # its jobs (version 2) leave the sum: a sum went back to what it was
    seen += [manager.jobs_version(), manager.runs_version()]
    manager.connections["v1"] = again = _stopped_connection("v1")  # the same name and job versions anew
    seen += [manager.jobs_version(), manager.runs_version()]
    assert manager.jobs_version() == seen[-2]  # nothing changed: the same
    jobs, runs = seen[0::2], seen[1::2]
    assert jobs == sorted(set(jobs)) and runs == sorted(set(runs)), seen  # each change a new, higher one
    again.jobs.add({"job": "j3", "state": "finished", "total": 1, "done": 1, "failed": 0})
    assert manager.jobs_version() == jobs[-1] + 1


# -- only the user's own files (issue: the server read any file the kernel's runs() refused) ----------
def test_only_the_users_own_private_history_files_are_read_and_the_folder_is_made_private(tmp_path, caplog):
    """The kernel's jc.runs() reads only this user's 0600 files; the server took any file in the folder."""
    import logging
    import stat

    folder = tmp_path / "history"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)  # made by an older version (makedirs leaves an existing folder's mode alone)
    history = HistoryFolder(str(folder))
    kept = KeptCluster.from_connection("c1.stopped-120000", _stopped_connection("c1"), PANEL_MODEL)
    assert history.save(kept) == []
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    good = folder / "c1.stopped-120000.json"
    assert stat.S_IMODE(os.stat(good).st_mode) == 0o600
    # the same content where others could have written it, and through a link: neither is the user's history
    (folder / "open.stopped-1.json").write_text(good.read_text().replace("c1.stopped-120000", "open.stopped-1"))
    (folder / "open.stopped-1.json").chmod(0o644)
    elsewhere = tmp_path / "elsewhere.json"
    _write(elsewhere, good.read_text().replace("c1.stopped-120000", "link.stopped-1"))
    (folder / "link.stopped-1.json").symlink_to(elsewhere)
    with caplog.at_level(logging.WARNING, logger="jupyter_cluster.server.history"):
        assert [k.key for k in HistoryFolder(str(folder)).load()] == ["c1.stopped-120000"]
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "open.stopped-1.json" in warned and "link.stopped-1.json" in warned
    # a folder that is not the user's own (a link to one) is not written into
    (tmp_path / "linked").symlink_to(folder)
    assert HistoryFolder(str(tmp_path / "linked")).save(kept) == [kept.key]


def test_a_kept_topic_gives_its_run_items_as_a_live_store_does_in_the_server_and_the_kernel():
    """The kernel's copy of the kept topic gave every item's curves whether asked or not."""
    from jupyter_cluster.tracking.kept import _KeptTopic

    conn = _stopped_connection()
    store = conn.metrics["es"]
    store.add(
        "src",
        6,
        [
            {
                "step": s,
                "time": time.time(),
                "run": "r1",
                "item": "lr=0.1",
                "config": {"lr": 0.1},
                "values": {"loss": 1.0 / (s + 1)},
            }
            for s in range(3)
        ],
    )
    kept = KeptCluster.from_connection("c1.stopped-120000", conn, PANEL_MODEL).metrics["es"]
    kernel = _KeptTopic("es", kept.data["runs"])
    for curves in (False, True):
        live = store.run_items(curves=curves)
        assert kept.run_items(curves=curves) == kernel.run_items(curves=curves) == live
        assert kept.run_items({"nope"}, curves) == kernel.run_items({"nope"}, curves) == {}
    assert "curves" not in kernel.run_items()["r1"]["lr=0.1"]


# -- final words the server cannot take up ------------------------------------------------------------
def _final_word(name: str, record: registry.ClusterRecord | None = None, **fields) -> dict:
    """What an owner leaves of a cluster it stopped (session._leave_final_word), one finished job."""
    now = time.time()
    job = {"job": f"{name}-j", "label": "f", "total": 1, "done": 1, "failed": 0, "state": "finished"}
    data = {
        "format": 1,
        "key": name,
        "record": {"address": "tcp://127.0.0.1:1", "owner_pid": 1, "started": 1.0}
        if record is None
        else {"address": record.address, "owner_pid": record.owner_pid, "started": record.started},
        "saved": now,
        "summary": {},
        "jobs": [dict(job, started=now, updated=now)],
        "topics": [],
    }
    return {**data, **fields}


def test_final_words_no_owner_wrote_go_and_others_are_not_read_again_at_every_scan(tmp_path, monkeypatch, caplog):
    """The registry is scanned twice a second: a damaged or unclaimed final word (up to 16 MB) was read each time.

    One named after another cluster than it holds, or not JSON, is no owner's
    (they write it whole and rename it): deleted.  One the server cannot take
    up is warned about once and left to look at, unread; one whose cluster's
    record is still there is read again only once the record has gone.
    """
    import asyncio
    import logging

    from jupyter_cluster.server.manager import ClusterManager

    def write(path: str, text: str) -> None:
        with open(path, "w") as f:  # (the file stays 0600)
            f.write(text)

    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    misnamed = registry.write_final("named-a", _final_word("named-b"))
    not_json = registry.write_final("junk", _final_word("junk"))
    write(not_json, "{not json")
    damaged = registry.write_final("damaged", _final_word("damaged", jobs="j1"))
    record = registry.ClusterRecord(name="held", backend="local", address="tcp://127.0.0.1:1", owner_kind="process")
    registry.write(record)
    held = registry.write_final("held", _final_word("held", record))
    with open(held) as f:
        held_text = f.read()
    loop = asyncio.new_event_loop()
    manager = ClusterManager(interval=60)
    try:
        with caplog.at_level(logging.WARNING, logger="jupyter_cluster.server.snapshots"):
            loop.run_until_complete(manager.refresh())
            assert not os.path.exists(misnamed) and not os.path.exists(not_json)
            assert os.path.exists(damaged) and os.path.exists(held)
            for path in (damaged, held):  # read again, these would now be deleted as no owner's
                write(path, "{not json")
            loop.run_until_complete(manager.refresh())
            assert os.path.exists(damaged) and os.path.exists(held)
            write(held, held_text)
            registry.remove("held")  # its cluster gone: taken up at the next scan
            loop.run_until_complete(manager.refresh())
            assert not os.path.exists(held)
            assert [h["cluster"] for h in manager.history_list()] == ["held"]
            loop.run_until_complete(manager.refresh())
    finally:
        loop.run_until_complete(manager.close())
        loop.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sum(damaged in w for w in warnings) == 1, warnings


def test_a_final_word_gives_a_followed_cluster_the_topics_its_subscription_had_not_read(tmp_path, monkeypatch):
    """A cluster stopped while the server was still subscribing: its kept runs had rows but no metrics.

    On a loaded machine the server had read the jobs' backlog and not yet the
    metrics' when a Run All notebook stopped its cluster (the sweep table in
    the main area then showed no curves).  The owner's final word carries its
    own copy of the runs' topics; the server takes a topic it lacks from it and
    keeps the one it follows.
    """
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    from jupyter_cluster.server.manager import ClusterManager

    manager = ClusterManager()
    conn = _stopped_connection("fw")
    manager.connections["fw"] = conn
    owners = {}
    for topic in ("sweep", "es"):  # "es": the connection follows it already
        owners[topic] = store = TopicStore(topic)
        records = [
            {"step": s, "time": 1.0, "series": {}, "values": {"loss": 1.0 / (s + 1)}, "run": "run-1", "item": f"i{i}"}
            for i in range(3)
            for s in range(5)
        ]
        store.add("owner", 0, records)
    record = conn.record
    data = {
        "format": 1,
        "key": "fw",
        "record": {"address": record.address, "owner_pid": record.owner_pid, "started": record.started},
        "saved": time.time(),
        "summary": {},
        "jobs": [{"job": "j9", "run": "run-1", "state": "finished", "total": 3, "done": 3, "failed": 0}],
        "topics": [s.snapshot(**PANEL_MODEL) for s in owners.values()],
    }
    followed = conn.metrics["es"]
    path = registry.write_final("fw", data)
    manager._take_final(path, json.loads(json.dumps(data)), {})  # as read from the file, the record gone
    items = conn.metrics["sweep"].run_items({"run-1"})["run-1"]
    assert sorted(items) == ["i0", "i1", "i2"] and items["i0"]["final"] == {"loss": 0.2}
    assert conn.metrics["es"] is followed  # what the subscription read stays
    assert "j9" in conn.jobs.jobs and not os.path.exists(path)
    kept = KeptCluster.from_connection("fw.stopped-1", conn, PANEL_MODEL)
    assert kept.metrics["sweep"].run_items({"run-1"})["run-1"]["i2"]["final"] == {"loss": 0.2}
