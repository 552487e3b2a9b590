"""The sweep table widget's data (jupyter_cluster.widgets.sweep), from a real sweep on a real cluster.

The browser side (sorting, filtering, grouping, overlay) is tested in
tests/ui/test_sweep.py; this checks what the kernel sends it: one row per
item with its config and metrics, each row's own curve, the series match for
rows given as a DataFrame, and the errors for bad arguments.
"""

from __future__ import annotations

import re

import pytest

import jupyter_cluster as jc
from jupyter_cluster.widgets import sweep

from ..helpers import unique_topic

SWEEP = """%%parallel cfg in grid
import jupyter_cluster as jc
for step in range(3):
    jc.report(step=step, topic=TOPIC, trial=cfg["trial"], loss=cfg["lr"] * (3 - step) + cfg["trial"])
cfg["trial"]
"""


def test_show_runs_sends_each_items_row_and_own_curve(ip, cluster):
    topic = unique_topic("sweep-widget")
    grid = [{"trial": i, "lr": (0.1, 0.01)[i % 2], "aux": i % 3 == 0} for i in range(12)]
    ip.user_ns.update(grid=grid, TOPIC=topic)
    r = ip.run_cell(SWEEP)
    assert r.error_in_exec is None and r.error_before_exec is None
    df = jc.runs()
    run_id = df["run"].iloc[-1]

    rows = sweep.current_rows(run=run_id)
    own, models, topics = sweep._curves(rows, topic)
    assert models == []  # every item has its own curve: the topic's models are not needed
    data = sweep.sweep_data(rows, models, "t", own, topics)
    assert len(data["rows"]) == 12 and len({row["id"] for row in data["rows"]}) == 12
    by_trial = {row["config"]["trial"]: row for row in data["rows"]}
    assert by_trial[3]["config"] == {"trial": 3, "lr": 0.01, "aux": True}
    assert by_trial[3]["final"]["loss"] == pytest.approx(0.01 + 3)
    assert by_trial[3]["best"]["loss"] == pytest.approx(0.01 + 3)  # a loss: its lowest
    curve = data["curves"]["loss"][by_trial[3]["id"]]
    assert [s for s, _ in curve] == [0, 1, 2] and curve[0][1] == pytest.approx(0.03 + 3)
    # each row's colour is its series' colour in the topic's metric charts (colours over the topic's keys)
    from jupyter_cluster import telemetry
    from jupyter_cluster.widgets import static_render as sr

    chart_keys = sweep.topic_series(telemetry.store(topic).model())
    assert chart_keys == [f"trial={i}" for i in range(12)] and data["colorKeys"] == chart_keys
    assert all(row["series"] == f"trial={t}" for t, row in by_trial.items())
    chart_colors = sr.assign_colors(chart_keys)
    colors = sweep.row_colors(data)
    assert {colors[row["id"]] for row in data["rows"]} == set(chart_colors.values())
    assert all(colors[row["id"]] == chart_colors[f"trial={t}"] for t, row in by_trial.items())

    # a terminal shell gets the table as a DataFrame; the widget class draws the same rows
    assert len(jc.show_runs(run=run_id)) == 12
    w = sweep.widget_class()(None, {"notebook": None, "run": run_id}, topic, "t")
    assert len(w.data["rows"]) == 12 and len(w.data["curves"]["loss"]) == 12
    # its static copy, for a notebook saved without the kernel: the table as text, the curves as an image
    static = w.static_bundle()
    lines = static["text/plain"].splitlines()
    assert lines[0] == "t: 12 rows" and lines[1].split() == ["run", "state", "trial", "lr", "aux", "loss"]
    assert (
        len(lines) == 15 and "<img" in static["text/html"] and static["text/html"].count("<tr>") == 13
    )  # title, header, 12 rows, the ★ note
    assert "<script" not in static["text/html"]
    # the static copy's swatches are the rows' colours (the same as the live widget's and the charts')
    swatches = re.findall(r'class="jc-swatch" style="color:(#[0-9a-f]{6})"', static["text/html"])
    assert swatches == [colors[row["id"]] for row in w.data["rows"]]

    # rows given as jc.runs()'s DataFrame carry no item key: their curves are the series named by trial
    given = sweep._rows_from(jc.runs(run=run_id))
    from jupyter_cluster.telemetry.topic_store import all_stores

    models = [s.model() for s in all_stores() if s.topic == topic]
    data = sweep.sweep_data(given, models, "t", {run_id: own[run_id]})
    assert len(data["curves"]["loss"]) == 12
    assert sweep.series_of({"key": None, "config": {"trial": 3, "aux": True}}, ["trial=3", "all"]) == "trial=3"
    assert sweep.series_of({"key": None, "config": {"aux": True}}, ["aux=True"]) == "aux=True"
    assert sweep.series_of({"key": None, "config": {}}, ["all"]) is None


def test_show_runs_says_what_is_wrong_with_its_arguments():
    with pytest.raises(TypeError, match="DataFrame of jc.runs"):
        jc.show_runs(42)
    with pytest.raises(TypeError, match="row dicts"):
        jc.show_runs([{"lr": 1}])
    with pytest.raises(TypeError, match="topic must be a non-empty string"):
        jc.show_runs(topic="")


def test_a_static_copy_draws_rows_that_share_a_name_apart():
    """One item key in two runs: the static chart drew one line, in one colour, for both rows."""
    import base64

    rows = [
        {
            "run": run,
            "key": "lr=0.1",
            "item": 0,
            "name": "lr=0.1",
            "state": "finished",
            "duration": 1.0,
            "config": {"lr": 0.1},
            "final": {"loss": loss},
            "best": {"loss": loss},
        }
        for run, loss in (("r1", 1.0), ("r2", 2.0))
    ]
    own = {r["run"]: {"loss": {"lr=0.1": [[0, 3.0], [1, r["final"]["loss"]]]}} for r in rows}
    data = sweep.sweep_data(rows, [], "t", own, {})
    colors = sweep.row_colors(data)
    assert len(data["curves"]["loss"]) == 2 and len(set(colors.values())) == 2
    html = sweep.static_bundle(data)["text/html"]
    svg = base64.b64decode(re.search(r"base64,([^\"]+)", html).group(1)).decode()
    assert re.findall(r'<path d="[^"]*" fill="none" stroke="(#[0-9a-f]{6})"', svg) == [
        colors[row["id"]] for row in data["rows"]
    ]
    assert ">lr=0.1<" in svg and ">lr=0.1 (2)<" in svg  # the legend tells them apart


def test_a_live_table_shows_the_run_it_was_made_for_and_every_widens_it(ip, cluster):
    """A later, unrelated map does not add its rows (30 became 38); made before any run, the next one."""
    from jupyter_cluster.tracking.record import kept_jobs
    from jupyter_cluster.tracking.table import group_runs
    from jupyter_cluster.widgets.run_pin import RunPin

    topic = unique_topic("pinned")
    grid = [{"trial": i, "lr": 0.1} for i in range(3)]
    ip.user_ns.update(grid=grid, TOPIC=topic)
    assert ip.run_cell(SWEEP).error_in_exec is None
    sweep_run = jc.runs()["run"].iloc[-1]
    pin_after = RunPin(group_runs(kept_jobs()).values())
    w = sweep.widget_class()(None, {"notebook": None, "run": None, "pin": pin_after}, topic, "t")
    every_before = len(sweep.current_rows())
    assert ip.run_cell("%%parallel m in range(8) --no-progress\nm").error_in_exec is None  # unrelated
    w.refresh()
    assert len(w.data["rows"]) == 3 and {r["run"] for r in sweep.current_rows(pin=pin_after)} == {sweep_run}
    assert len(sweep.current_rows()) == every_before + 1  # every=True: the map's one row too
    assert len(jc.show_runs()) == 1  # outside a widget front end, the newest run: the map
    # made before any run: the first that starts after it
    early = RunPin([], now=0.0)
    assert early.resolve([{"run": "a", "started": 5.0}, {"run": "b", "started": 3.0}]) == "b"
    assert early.resolve([{"run": "c", "started": 9.0}]) == "b"


def test_a_static_copy_draws_the_best_runs_of_a_loss_and_marks_each_metrics_best():
    """30 runs: the saved copy drew the 12 *worst* loss runs (highest last value) and the first metric (acc)."""
    import base64

    rows = [
        {
            "run": "r1",
            "key": f"trial={i}",
            "item": i,
            "name": f"trial={i}",
            "state": "finished",
            "duration": 1.0,
            "config": {"trial": i},
            "final": {"acc": i / 30, "loss": 1.0 + i},
            "best": {"acc": i / 30, "loss": 1.0 + i},
        }
        for i in range(30)
    ]
    own = {"r1": {"loss": {f"trial={i}": [[0, 50.0], [1, 1.0 + i]] for i in range(30)}, "acc": {}}}
    data = sweep.sweep_data(rows, [], "t", own, {})
    bundle = sweep.static_bundle(data)
    svgs = [base64.b64decode(m).decode() for m in re.findall(r"base64,([^\"]+)", bundle["text/html"])]
    assert len(svgs) == 1 and ">loss<" in svgs[0]  # the loss is drawn, not the alphabetically first acc
    drawn = set(re.findall(r">(trial=\d+)<", svgs[0]))
    assert drawn == {f"trial={i}" for i in range(12)}, sorted(drawn)  # the 12 lowest losses
    assert "the 12 with the lowest last value" in svgs[0]
    assert sweep.best_rows(data["rows"], ["loss", "acc"]) == {
        "loss": data["rows"][0]["id"],
        "acc": data["rows"][29]["id"],
    }
    plain = bundle["text/plain"].splitlines()
    assert "★" in next(line for line in plain if line.startswith("trial=0 "))
    assert "★" in next(line for line in plain if line.startswith("trial=29 "))
    assert sum("★" in line for line in plain) == 3  # two best cells and the note
