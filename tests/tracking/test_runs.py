"""Runs as records (jupyter_cluster/tracking/: tags, context, record, table, kept, runs): configs of sweep items, report(config=), jc.runs().

The sweep tests run real ``%%parallel`` cells in the real IPython shell on a
real 2-worker cluster; the table is what ``jc.runs()`` returns.
"""

from __future__ import annotations

import math

import pytest

import jupyter_cluster as jc
from jupyter_cluster.telemetry import TopicStore
from jupyter_cluster.tracking.tags import ItemTag, config_key, item_config, target_names

from ..helpers import unique_topic

pytestmark = pytest.mark.timeout(240)


def test_an_items_config_is_its_dict_or_the_targets_it_binds():
    assert item_config(target_names("cfg"), {"lr": 0.1, "mom": 0.9}) == {"lr": 0.1, "mom": 0.9}
    assert item_config(target_names("lr, mom"), (0.1, 0.9)) == {"lr": 0.1, "mom": 0.9}
    assert item_config(target_names("seed"), 3) == {"seed": 3}
    assert item_config(target_names("(a, b), c"), ((1, 2), "x")) == {"a": 1, "b": 2, "c": "x"}
    assert item_config(target_names("i, cfg"), (2, {"lr": 1})) == {"i": 2, "cfg": "{'lr': 1}"}  # a dict below: text
    odd = item_config(target_names("x"), object())
    assert isinstance(odd["x"], str) and odd["x"].startswith("<object")  # kept as its (clipped) repr
    assert config_key({"mom": 0.9, "lr": 0.1}) == "lr=0.1, mom=0.9"
    tag = ItemTag("r1", "lr, mom")
    assert tag.describe((0.1, 0.9)) == ("lr=0.1, mom=0.9", {"lr": 0.1, "mom": 0.9})


def test_report_config_is_checked_before_anything_is_sent():
    topic = unique_topic("cfg-check")
    with pytest.raises(TypeError, match=r"report\(config=\.\.\.\) must be a dict"):
        jc.report(step=0, topic=topic, loss=1.0, config=[("lr", 0.1)])
    with pytest.raises(TypeError, match="keys must be non-empty strings"):
        jc.report(step=0, topic=topic, loss=1.0, config={1: 2})
    from jupyter_cluster.telemetry.topic_store import topics

    assert topic not in topics()  # nothing was recorded


def test_a_store_keeps_each_items_final_and_best_values():
    store = TopicStore("t")
    recs = [
        {
            "step": s,
            "time": 1.0,
            "series": {},
            "values": {"loss": 5.0 - s, "acc": [0.1, 0.9][s % 2]},
            "run": "r",
            "item": "k",
        }
        for s in range(4)
    ]
    recs.append(
        {
            "step": 9,
            "time": 1.0,
            "series": {},
            "values": {"loss": 3.0},
            "run": "r",
            "item": "k",
            "config": {"arch": "mlp"},
        }
    )
    recs.append({"step": 0, "time": 1.0, "series": {}, "values": {"loss": 1.0}, "run": ["bad"], "item": "k"})  # no run
    assert store.add("src", 0, recs) == 6
    items = store.run_items()
    assert list(items) == ["r"]
    it = items["r"]["k"]
    assert it["final"] == {"loss": 3.0, "acc": 0.9} and it["steps"] == 9
    assert it["best"] == {"loss": 2.0, "acc": 0.9}  # loss: the lowest; acc: the highest
    assert it["config"] == {"arch": "mlp"}
    assert store.run_items(curves=True)["r"]["k"]["curves"]["loss"] == [
        [0, 5.0],
        [1, 4.0],
        [2, 3.0],
        [3, 2.0],
        [9, 3.0],
    ]
    again = TopicStore.restore(store.snapshot())  # kept across a server restart
    assert again.run_items()["r"]["k"]["best"] == {"loss": 2.0, "acc": 0.9}
    assert again.run_items(curves=True)["r"]["k"]["curves"]["acc"] == [[0, 0.1], [1, 0.9], [2, 0.1], [3, 0.9]]


def test_an_items_curve_stays_bounded_and_spans_the_whole_run():
    from jupyter_cluster.telemetry.topic_store import CURVE_POINTS

    store = TopicStore("long")
    n = 10 * CURVE_POINTS
    store.add(
        "src",
        0,
        [
            {"step": s, "time": 1.0, "series": {}, "values": {"loss": float(s)}, "run": "r", "item": ""}
            for s in range(n)
        ],
    )
    points = store.run_items(curves=True)["r"][""]["curves"]["loss"]
    assert CURVE_POINTS // 2 <= len(points) <= CURVE_POINTS
    assert points[0][0] == 0 and points[-1][0] >= n - n // CURVE_POINTS * 2  # from the first report to near the last
    assert store.run_items()["r"][""]["final"] == {"loss": float(n - 1)}  # the final value is exact


SWEEP = """%%parallel cfg in grid
import jupyter_cluster as jc
for step in range(4):
    jc.report(step=step, topic=TOPIC, loss=cfg["lr"] * (4 - step) + cfg["mom"], acc=step * cfg["mom"])
jc.report(step=4, topic=TOPIC, config={"width": 32 * (1 + cfg["seed"])}, loss=cfg["lr"] + cfg["mom"] + 0.5)
cfg["seed"]
"""


def test_a_30_item_sweep_gives_jc_runs_with_config_columns_and_final_metrics(ip, cluster):
    topic = unique_topic("sweep")
    grid = [
        {"lr": lr, "mom": m, "seed": s}
        for lr in (0.1, 0.03, 0.01, 0.003, 0.001)
        for m in (0.0, 0.5, 0.9)
        for s in (0, 1)
    ]
    assert len(grid) == 30
    ip.user_ns.update(grid=grid, TOPIC=topic)
    r = ip.run_cell(SWEEP)
    assert r.error_in_exec is None and r.error_before_exec is None
    job = ip.user_ns["_parallel_job"]
    df = jc.runs(run=next(rid for rid, tap in _runs_of(job)))
    assert len(df) == 30
    assert list(df["item"]) == list(range(30))
    for col in ("lr", "mom", "seed", "width", "loss", "loss.best", "acc", "acc.best"):
        assert col in df.columns, df.columns
    for row, cfg in zip(df.itertuples(index=False), grid):
        d = row._asdict()
        assert (d["lr"], d["mom"], d["seed"]) == (cfg["lr"], cfg["mom"], cfg["seed"])
        assert d["width"] == 32 * (1 + cfg["seed"])  # added by report(config=...) on the worker
        assert d["state"] == "finished"
        assert math.isclose(df.loc[d["item"], "loss"], cfg["lr"] + cfg["mom"] + 0.5)  # the last step's value
        assert math.isclose(df.loc[d["item"], "loss.best"], min(cfg["lr"] + cfg["mom"], cfg["lr"] + cfg["mom"] + 0.5))
        assert math.isclose(df.loc[d["item"], "acc.best"], 3 * cfg["mom"])
    assert set(df["name"]) == {f"In [{df['cell'].iloc[0]}] · %%parallel cfg in grid"}
    # each item's own curve, though every item reported on the one series "all"
    from jupyter_cluster.telemetry.topic_store import all_stores
    from jupyter_cluster.tracking.table import merge_curves

    run_id = df["run"].iloc[0]
    curves = merge_curves(all_stores(), run_id)
    assert len(curves["loss"]) == 30 and all(len(points) == 5 for points in curves["loss"].values())
    first = curves["loss"]["lr=0.1, mom=0.0, seed=0"]
    assert [s for s, _ in first] == [0, 1, 2, 3, 4] and math.isclose(first[0][1], 0.4)


def _runs_of(job):
    from jupyter_cluster.tracking.record import _taps

    tap = _taps[job.id]
    yield tap.tag.run, tap


def test_named_targets_failed_items_and_a_named_run_are_rows(ip, cluster):
    topic = unique_topic("named")
    ip.user_ns.update(TOPIC=topic)
    cell = (
        "%%parallel lr, mom in [(0.1, 0.5), (0.2, 0.6), (0.3, 0.7)] --errors collect\n"
        "import jupyter_cluster as jc\n"
        "jc.report(step=1, topic=TOPIC, val_acc=lr + mom)\n"
        "if lr == 0.2:\n"
        "    raise ValueError('bad lr')\n"
    )
    assert ip.run_cell(cell).error_in_exec is None
    run_id = next(rid for rid, _ in _runs_of(ip.user_ns["_parallel_job"]))
    df = jc.runs(run=run_id).set_index("item")
    assert list(df["state"]) == ["finished", "failed", "finished"]
    assert list(df["lr"]) == [0.1, 0.2, 0.3] and list(df["mom"]) == [0.5, 0.6, 0.7]
    assert math.isclose(df.loc[2, "val_acc"], 1.0)

    with jc.run("baseline", config={"opt": "sgd"}) as run:
        jc.report(step=0, topic=topic, score=3.0, config={"lr": 0.5})
        jc.report(step=1, topic=topic, score=2.0)
        jc.map(abs, [-1, 2], client=cluster)
    row = jc.runs(run=run.id)
    assert len(row) == 1
    d = row.iloc[0]
    assert (d["opt"], d["lr"], d["score"], d["score.best"], d["state"]) == ("sgd", 0.5, 2.0, 3.0, "finished")
    assert d["name"].endswith("baseline")
    with pytest.raises(TypeError, match="run\\(\\) needs a name"):
        jc.run("")


def test_the_maps_of_one_cell_are_one_run_and_carry_their_number(ip, cluster):
    from jupyter_cluster.tracking.record import kept_jobs

    before = {j["job"] for j in kept_jobs()}
    cell = "import jupyter_cluster as jc\nfor gen in range(3):\n    jc.map(abs, [-gen, gen])\n"
    assert ip.run_cell(cell).error_in_exec is None
    assert ip.run_cell("jc.map(abs, [1])").error_in_exec is None
    new = [j for j in kept_jobs() if j["job"] not in before]
    assert len(new) == 4
    loop, single = new[:3], new[3]
    assert len({j["run"] for j in loop}) == 1 and single["run"] != loop[0]["run"]
    assert [j["context"]["job"] for j in loop] == [1, 2, 3]
    assert loop[0]["cell"]["first_line"] == "import jupyter_cluster as jc"
    df = jc.runs(run=loop[0]["run"])
    assert len(df) == 1 and df.iloc[0]["state"] == "finished"

    with jc.run("es", config={"sigma": 0.1}) as run:
        for g in range(2):
            run.set(generation=g)
            jc.map(abs, [g], client=cluster)
    evaluate = [j for j in kept_jobs() if j.get("run") == run.id and j.get("kind") == "map"]
    assert [(j["context"]["generation"], j["context"]["job"], j["context"]["run"]) for j in evaluate] == [
        (0, 1, "es"),
        (1, 2, "es"),
    ]
    assert all(j["config"] == {"sigma": 0.1} for j in evaluate)


def report_plain(topic, x):
    """A plain map's function (workers import it from here): its reports belong to no sweep item."""
    jc.report(step=1, topic=topic, v=-1.0)
    return x


def test_a_report_deep_below_an_item_is_tagged_and_a_later_plain_map_is_not(ip, cluster):
    import functools

    from jupyter_cluster.telemetry.topic_store import store

    topic = unique_topic("deep")
    ip.user_ns.update(TOPIC=topic)
    cell = (
        "%%parallel seed in range(4) --sweep\n"
        "import jupyter_cluster as jc\n"
        "def deep(k):\n"  # a function of the cell: its namespace outlives the item until the GC runs
        "    return jc.report(step=0, topic=TOPIC, v=float(seed)) if k == 0 else deep(k - 1)\n"
        "deep(60)\n"
    )
    assert ip.run_cell(cell).error_in_exec is None
    run_id = next(rid for rid, _ in _runs_of(ip.user_ns["_parallel_job"]))
    jc.map(functools.partial(report_plain, topic), range(8), client=cluster)
    jc.runs()  # waits for the reports at the scheduler
    items = store(topic).run_items()
    assert list(items) == [run_id]
    assert {k: it["final"]["v"] for k, it in items[run_id].items()} == {f"seed={s}": float(s) for s in range(4)}
    assert store(topic).received == 12  # the plain map's 8 reports arrived, untagged


def test_an_items_tag_holds_only_while_its_cell_runs_in_this_thread():
    """As a worker runs an item (PreparedCell: exec of the cell in a fresh namespace), in this process."""
    import gc
    import threading

    from jupyter_cluster.engine.worker.run import PreparedCell
    from jupyter_cluster.telemetry.tags import current_item
    from jupyter_cluster.tracking.tags import ItemTag

    tag = ItemTag("run-1", "lr, mom")
    worked_out = []
    key_and_config = tag.key_and_config
    tag.key_and_config = lambda item: worked_out.append(item) or key_and_config(item)  # type: ignore[method-assign]
    seen = {}
    code = compile(
        "def below(k):\n"  # a function of the cell: namespace -> function -> namespace, a cycle
        "    return current_item() if k == 0 else below(k - 1)\n"
        "seen['deep'] = below(100)\n"
        "seen['again'] = current_item()\n"
        "t = threading.Thread(target=lambda: seen.__setitem__('thread', current_item()))\n"
        "t.start(); t.join()\n"
        "seen['later'] = below\n",
        "<cell>",
        "exec",
    )
    values = {"current_item": current_item, "seen": seen, "threading": threading}
    run_item = PreparedCell(code, values, persistent=False, tag=tag).bind(None)
    gc.disable()  # the cycle keeps the namespace alive after the item, as it may on a worker
    try:
        run_item((0.1, 0.9))
        assert seen["deep"] == seen["again"] == ("run-1", "lr=0.1, mom=0.9", {"lr": 0.1, "mom": 0.9})
        assert worked_out == [(0.1, 0.9)]  # once per item, however often it reports
        assert seen["thread"] is None  # a thread the item started is not tagged
        assert current_item() is None  # the item ended: a later task on this thread is not tagged
        assert seen["later"](3) is None  # nor is the item's own function, called after the item ended
        assert tag.cached is None  # and the tag keeps no item once it ended
    finally:
        gc.enable()


def test_an_spmd_cell_is_a_run(ip, cluster):
    from jupyter_cluster.tracking.record import kept_jobs

    before = {j["job"] for j in kept_jobs()}
    assert ip.run_cell("%%spmd\nx = rank").error_in_exec is None
    [job] = [j for j in kept_jobs() if j["job"] not in before]
    assert (job["kind"], job["state"], job["total"], job["cell"]["first_line"]) == ("spmd", "finished", 2, "%%spmd")
    row = jc.runs(run=job["run"]).iloc[0]
    assert row["state"] == "finished" and row["name"].endswith("· %%spmd")


def test_a_long_sweep_lists_a_bounded_number_of_items_and_counts_the_rest(ip, cluster):
    from jupyter_cluster.tracking.record import kept_jobs
    from jupyter_cluster.tracking.tags import MAX_ITEMS

    assert ip.run_cell(f"%%parallel i in range({MAX_ITEMS + 500}) --no-progress --sweep\ni").error_in_exec is None
    job = ip.user_ns["_parallel_job"]
    [msg] = [j for j in kept_jobs() if j["job"] == job.id]
    assert msg["item_count"] == MAX_ITEMS + 500 and len(msg["items"]) == MAX_ITEMS
    assert msg["items"][-1] == {
        "index": MAX_ITEMS - 1,
        "key": f"i={MAX_ITEMS - 1}",
        "config": {"i": MAX_ITEMS - 1},
        "state": "finished",
        "duration": msg["items"][-1]["duration"],
    }
    assert job.total == MAX_ITEMS + 500  # the tap keeps the iterable's length


def test_jobs_group_into_runs_with_their_counts_state_and_duration():
    from jupyter_cluster.tracking.table import group_runs

    def job(i, run, state, started, updated, kind="map", **kw):
        return {"job": i, "run": run, "kind": kind, "label": "evaluate", "state": state, "started": started,
                "updated": updated, "total": 2, "done": 2 if state == "finished" else 1, "failed": int(state == "failed"), **kw}  # fmt: skip

    cell = {"execution_count": 5, "cell_id": None, "first_line": "for g in range(3):"}
    runs = group_runs(
        [
            job("a", "a", "finished", 1.0, 2.0, notebook="nb/es.ipynb", cell=cell),
            job("b", "a", "failed", 3.0, 4.0),
            job("c", "a", "finished", 5.0, 6.0),
            job("r", "r", "finished", 10.0, 20.0, kind="run", config={"sigma": 0.1}, ended=20.0),
            job("d", "r", "running", 11.0, 12.0),
        ]
    )
    a, r = runs["a"], runs["r"]
    assert (a["state"], a["jobs"], a["total"], a["done"], a["failed"]) == ("failed", ["a", "b", "c"], 6, 5, 1)
    assert (a["started"], a["ended"], a["duration"]) == (1.0, 6.0, 5.0)
    assert a["name"] == "es.ipynb · In [5] · for g in range(3):"
    # a named run: its own record's state and config; its jobs' counts
    assert (r["kind"], r["state"], r["config"], r["jobs"], r["total"]) == ("run", "finished", {"sigma": 0.1}, ["d"], 2)
    assert r["name"] == "evaluate" and r["duration"] == 10.0
    running = group_runs([job("x", "x", "finished", 1.0, 2.0), job("y", "x", "running", 3.0, 4.0)])["x"]
    assert running["state"] == "running" and running["ended"] is None


def test_the_kernel_keeps_a_bounded_number_of_sweep_items(monkeypatch):
    import importlib

    record_module = importlib.import_module("jupyter_cluster.tracking.record")
    monkeypatch.setattr(record_module, "KEEP_ITEMS", 25)
    ids = [f"bound-{i}-{id(monkeypatch)}" for i in range(3)]
    for i, job in enumerate(ids):
        items = [
            {"index": k, "key": f"k={k}", "config": {"k": k}, "state": "finished", "duration": None} for k in range(10)
        ]
        record_module.keep(
            {"job": job, "run": job, "kind": "map", "state": "running", "started": float(i), "updated": 0.0}
        )
        record_module.keep({"job": job, "state": "finished", "updated": 1.0, "items": items, "item_count": 10})
    kept = {m["job"]: m for m in record_module.kept_jobs() if m["job"] in ids}
    assert [len(kept[j].get("items") or ()) for j in ids] == [0, 10, 10]  # the oldest sweep's list went
    assert kept[ids[0]]["item_count"] == 10 and kept[ids[0]]["state"] == "finished"  # its record stays


def report_named(topic, name, x):
    """A plain map's function: reports ``name = x`` at step ``x`` from a worker."""
    jc.report(step=x, topic=topic, **{name: float(x)})
    return x


def test_reports_from_maps_pools_and_sweeps_inside_a_named_run_are_the_runs(ip, cluster):
    import functools

    topic = unique_topic("in-run")
    with jc.run("tied", config={"opt": "adam"}) as run:
        jc.map(functools.partial(report_named, topic, "v"), [1, 2, 3], client=cluster)
        with jc.Pool(cluster=cluster) as pool:
            pool.map(functools.partial(report_named, topic, "w"), [4, 5])
    jc.map(functools.partial(report_named, topic, "v"), [9], client=cluster)  # after the block: not the run's
    [row] = jc.runs(run=run.id).to_dict("records")
    assert (row["opt"], row["v"], row["w"], row["state"]) == ("adam", 3.0, 5.0, "finished")

    # a %%parallel sweep inside the block: its items are the named run's rows, with the run's config
    ip.user_ns.update(TOPIC=topic)
    cell = (
        "with jc.run('swept', config={'opt': 'sgd'}) as swept:\n"
        "    get_ipython().run_cell_magic('parallel', 'seed in range(3) --sweep',\n"
        "        'import jupyter_cluster as jc\\njc.report(step=0, topic=TOPIC, u=float(seed))')\n"
    )
    assert ip.run_cell("import jupyter_cluster as jc\n" + cell).error_in_exec is None
    df = jc.runs(run=ip.user_ns["swept"].id)
    assert list(df["seed"]) == [0, 1, 2] and list(df["u"]) == [0.0, 1.0, 2.0]
    assert set(df["opt"]) == {"sgd"} and set(df["name"]) == {df["name"].iloc[0]}
    assert df["name"].iloc[0].endswith("swept")


KEPT_SCRIPT = """
import json, os, sys
import jupyter_cluster as jc

path = sys.argv[1]
out = {"rows": json.loads(jc.runs().to_json(orient="records"))}
os.chmod(path, 0o644)  # others may read it: not the server's file, never read
out["open"] = len(jc.runs())
os.chmod(path, 0o600)
out["again"] = len(jc.runs())
if os.getuid() == 0:  # as root, a file of another user can be made
    os.chown(path, 65534, -1)
    out["other"] = len(jc.runs())
print(json.dumps(out))
"""


def test_runs_lists_this_notebooks_runs_the_server_kept_after_a_kernel_restart(ip, cluster, tmp_path, monkeypatch):
    """A sweep's cluster stops and the server keeps it in its history folder; a new kernel's jc.runs() lists it."""
    import json
    import os
    import subprocess
    import sys

    from jupyter_cluster.server.connection import Connection
    from jupyter_cluster.server.history import HistoryFolder, KeptCluster
    from jupyter_cluster.server.snapshots import PANEL_MODEL
    from jupyter_cluster.state import registry
    from jupyter_cluster.telemetry.topic_store import store, topics
    from jupyter_cluster.tracking.record import kept_jobs

    notebook = str(tmp_path / "work" / "sweep-27.ipynb")
    monkeypatch.setenv("JPY_SESSION_NAME", notebook)  # as a Jupyter server starts a session's kernel
    topic = unique_topic("kept")
    grid = [{"lr": lr, "mom": 0.5, "seed": s} for lr in (0.1, 0.01) for s in (0, 1)]
    ip.user_ns.update(grid=grid, TOPIC=topic)
    r = ip.run_cell(SWEEP)
    assert r.error_in_exec is None and r.error_before_exec is None
    run_id = next(rid for rid, _ in _runs_of(ip.user_ns["_parallel_job"]))
    assert len(jc.runs(run=run_id)) == 4

    # what the server holds of the cluster once it stops: the jobs it heard (the kernel's, here; other
    # tests' runs have no notebook) and the topic's store, kept by the server's own code
    conn = Connection(registry.ClusterRecord(name="kept-27", backend="local", address=cluster.address))
    for job in kept_jobs():
        conn.jobs.add(job)
    assert topic in topics()
    conn.metrics[topic] = store(topic)
    kept = KeptCluster.from_connection("kept-27.stopped-070000", conn, PANEL_MODEL)
    folder = tmp_path / "runtime" / "jupyter-cluster-history"
    assert HistoryFolder(str(folder)).save(kept) == []
    path = folder / f"{kept.key}.json"
    assert os.stat(path).st_mode & 0o777 == 0o600
    damaged = folder / "damaged.json"
    damaged.write_text("{not json")
    damaged.chmod(0o600)

    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), JPY_SESSION_NAME=notebook)
    out = subprocess.run(
        [sys.executable, "-c", KEPT_SCRIPT, str(path)], capture_output=True, text=True, timeout=180, env=env
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    rows = got["rows"]
    assert {row["run"] for row in rows} == {run_id}  # this notebook's run only
    assert [(row["lr"], row["mom"], row["seed"]) for row in rows] == [(c["lr"], c["mom"], c["seed"]) for c in grid]
    for row, cfg in zip(rows, grid):
        assert row["state"] == "finished" and row["notebook"] == notebook
        assert row["width"] == 32 * (1 + cfg["seed"])  # report(config=...) on the worker, kept by the server
        assert math.isclose(row["loss"], cfg["lr"] + cfg["mom"] + 0.5)
        assert math.isclose(row["loss.best"], cfg["lr"] + cfg["mom"])
    assert got["open"] == 0 and got["again"] == 4
    assert got.get("other", 0) == 0


def test_plain_values_are_a_map_and_configurations_a_sweep():
    from jupyter_cluster.tracking.sweep_kind import is_sweep

    one, two = target_names("x"), target_names("lr, seed")
    assert not is_sweep(one, range(2000))  # the Collatz map: no 2,000 rows
    assert not is_sweep(one, [1e-4, 1e-3]) and not is_sweep(one, ("a.csv", "b.csv")) and not is_sweep(one, {"a": 1})
    assert is_sweep(one, range(3), asked=True)  # --sweep
    assert is_sweep(one, [{"lr": 0.1}, {"lr": 0.2}])  # dict items: configurations
    assert is_sweep(two, [(0.1, 0), (0.2, 1)])  # several targets
    assert is_sweep(one, iter([1, 2]))  # an iterator is not consumed to look: as before
    assert not is_sweep(one, [])
    tag = ItemTag("r1", "seed", sweep=False)
    assert tag.describe(3) == ("", {})  # a map's reports are its run's, not an item's


def test_a_sweep_items_reports_are_its_series_named_by_config():
    store = TopicStore("t")
    recs = [
        {"step": s, "time": 1.0, "series": {}, "values": {"loss": 1.0 / (s + 1)}, "run": "r", "item": key}
        for s in range(3)
        for key in ("lr=0.001, seed=0", "lr=0.01, seed=0")
    ]
    recs.append(
        {"step": 0, "time": 1.0, "series": {"member": 1}, "values": {"loss": 2.0}, "run": "r", "item": "lr=0.1"}
    )
    recs.append({"step": 0, "time": 1.0, "series": {}, "values": {"loss": 3.0}, "run": "r", "item": ""})  # a map's
    store.add("src", 0, recs)
    curves = store.model()["scalars"]["loss"]
    assert sorted(curves) == ["all", "lr=0.001, seed=0", "lr=0.01, seed=0", "member=1"]  # explicit series win
    assert [p[1] for p in curves["lr=0.01, seed=0"]] == [1.0, 0.5, 1 / 3]


def test_a_parallel_cell_over_numbers_is_one_run_row_unless_sweep_is_asked(ip, cluster):
    from jupyter_cluster.tracking.record import kept_jobs

    topic = unique_topic("map-or-sweep")
    ip.user_ns.update(TOPIC=topic)
    body = "import jupyter_cluster as jc\njc.report(step=0, topic=TOPIC, v=float(n))\nn"
    assert ip.run_cell(f"%%parallel n in range(8) --no-progress\n{body}").error_in_exec is None
    plain = ip.user_ns["_parallel_job"]
    assert ip.run_cell(f"%%parallel n in range(3) --no-progress --sweep\n{body}").error_in_exec is None
    swept = ip.user_ns["_parallel_job"]
    by_job = {j["job"]: j for j in kept_jobs()}
    assert "items" not in by_job[plain.id] and len(by_job[swept.id]["items"]) == 3
    plain_rows = jc.runs(run=by_job[plain.id]["run"])
    assert len(plain_rows) == 1 and plain_rows.iloc[0]["v"] in {float(n) for n in range(8)}
    assert len(jc.runs(run=by_job[swept.id]["run"])) == 3
