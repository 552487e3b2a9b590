"""Widgets' Python side on real clusters: cluster view, launcher, live metrics, text fallbacks."""

from __future__ import annotations

import functools
import statistics
import time
import uuid

import pytest

from jupyter_cluster import mapping, telemetry
from jupyter_cluster._core import context
from jupyter_cluster.cluster import session
from jupyter_cluster.widgets import cluster as cluster_mod
from jupyter_cluster.widgets import metrics as metrics_mod

from ..conftest import wait_for
from ..helpers import run_notebook, unique_topic


def _cells(table: str) -> list[str]:
    """The text of every header and data cell of an HTML table, in order."""
    import html
    import re

    return [
        html.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", table, re.S)
    ]


# -- cluster widget -------------------------------------------------------------------------
def test_cluster_widget_shows_workers_totals_and_link_and_refreshes(cluster):
    w = cluster_mod.ClusterWidget(cluster)
    m = w.model_data
    assert m["n_workers"] == 2 and m["cores"] == 2
    cells = _cells(w.table.value)
    for worker in m["workers"]:
        assert worker["name"] in cells
    assert cells[cells.index("total") + 1] == "2 workers"
    assert "tasks running" in cells and "memory (used / limit)" in cells
    assert cluster.dashboard_link in w.header.value
    assert w.scale_n.value == 2 and not w.scale_button.disabled
    first = w.model_data
    wait_for(lambda: w.model_data is not first, timeout=15, message="a live refresh")
    # the static copy a saved notebook keeps: the same table, and a few lines of text
    static = w.static_bundle()
    assert _cells(static["text/html"]) == _cells(w.table.value) and cluster.address in static["text/html"]
    assert static["text/plain"].startswith(f"{cluster.name} (local) at {cluster.address}")
    w.close()
    assert not w.wanted


def test_cluster_widget_columns_are_spaced_and_stay_on_one_line(cluster):
    """Every header and cell has room on both sides and does not wrap, so "CPU" and "tasks running",
    or a worker's threads, memory and CPU, no longer run together."""
    import re

    w = cluster_mod.ClusterWidget(cluster, live=False)
    cells = re.findall(r"<(t[hd])( style='[^']*')?>", w.table.value)
    assert len(cells) == 6 * (1 + 2 + 1)  # header, 2 workers, totals
    for tag, style in cells:
        assert "padding:2px 12px" in style and "white-space:nowrap" in style, (tag, style)
    w.close()


def test_tasks_column_counts_the_tasks_running_now(cluster):
    """The workers' "tasks" column comes from what the installed distributed reports
    (2026.8: ``metrics["task_counts"]``), so a long task shows as running."""
    from distributed import Event

    release = Event(f"release-{uuid.uuid4().hex[:6]}", client=cluster.client)

    def hold(event_name):
        from distributed import Event

        Event(event_name).wait(60)
        return 1

    futures = [cluster.client.submit(hold, release.name, key=f"hold-{i}-{uuid.uuid4().hex[:6]}") for i in range(2)]
    try:
        running = wait_for(
            lambda: sum(wk["executing"] for wk in cluster.model()["workers"]) == 2,
            timeout=20,
            message="both tasks counted as running",
        )
        assert running
        w = cluster_mod.ClusterWidget(cluster, live=False)
        cells = _cells(w.table.value)
        assert cells[-1] == "2"  # the totals row's tasks
        assert [cells[i + 5] for i in range(6, 18, 6)] == ["1", "1"]  # one per worker
        w.close()
    finally:
        release.set()
    assert cluster.client.gather(futures) == [1, 1]
    wait_for(
        lambda: sum(wk["executing"] for wk in cluster.model()["workers"]) == 0,
        timeout=20,
        message="the count back at 0",
    )


def test_attach_by_name_keeps_name_and_dashboard_and_says_why_it_cannot_scale(tmp_path):
    """``%cluster connect NAME`` to a cluster another process owns: the cluster's own name and
    dashboard link, its owner's registry record untouched (also after detaching), and a widget with
    no Scale/Adapt controls but one line saying why."""
    import subprocess
    import sys

    from jupyter_cluster.state import registry

    name = unique_topic("owned")
    script = tmp_path / "owner.py"
    script.write_text(
        "import sys\nimport jupyter_cluster as jc\n\nif __name__ == '__main__':\n"
        f"    h = jc.start(name={name!r}, workers=1)\n    sys.stdin.read()\n    h.close()\n"
    )
    owner = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        record = wait_for(lambda: registry.read(name), timeout=90, message="the owner's cluster in the registry")
        assert record.dashboard_link
        handle = session.connect(name)
        try:
            assert handle.name == name and handle.dashboard_link == record.dashboard_link
            assert not handle.owns_cluster and "attached by name" in handle.attachment
            assert handle.client.submit(pow, 2, 5).result() == 32
            assert registry.read(name).owner_pid == owner.pid  # the owner's record is still the owner's
            w = cluster_mod.ClusterWidget(handle, live=False)
            assert record.dashboard_link in w.header.value and f"<b>{name}</b>" in w.header.value
            assert w.scale_button not in w.children and "scale or adapt it where it was started" in w.controls.value
            w.scale(3)
            assert "cannot be scaled from here" in w.message.value
            w.close()
        finally:
            session.stop(name)  # detaches
        assert registry.read(name) is not None and registry.read(name).owner_pid == owner.pid
    finally:
        owner.communicate("", timeout=60)
    assert owner.returncode == 0


def test_cluster_widget_reports_a_refused_scale_in_its_message_line(cluster):
    w = cluster_mod.ClusterWidget(cluster, live=False)
    w.adapt(3, 1)
    assert "adapt needs 0 &lt;= --minimum &lt;= --maximum" in w.message.value
    w.close()


def test_handle_display_is_status_text_in_a_terminal_and_a_widget_in_a_kernel(ip, cluster, monkeypatch):
    data, _ = ip.display_formatter.format(cluster)
    assert data["text/plain"].startswith(f"{cluster.name} (local) at {cluster.address}")
    assert "2 workers" in data["text/plain"]
    monkeypatch.setattr(context, "in_kernel", lambda: True)
    data, _ = ip.display_formatter.format(cluster)
    assert "application/vnd.jupyter.widget-view+json" in data
    assert "<table>" in cluster._repr_html_()  # the static fallback for front-ends without widgets


# -- launcher -------------------------------------------------------------------------------
def test_launcher_labels_have_room_for_the_longest_one():
    """ "memory limit" was cut to "memory li…" by ipywidgets' default label width."""
    from jupyter_cluster.widgets.launcher import Launcher

    launcher = Launcher()
    fields = [launcher.backend, launcher.name, launcher.workers, launcher.threads, launcher.memory_limit]
    widths = {f.style.description_width for f in fields}
    assert len(widths) == 1  # the fields line up
    width = widths.pop()
    assert width.endswith("px") and int(width[:-2]) >= 8 * len("memory limit")
    launcher.close()


def test_launcher_starts_a_current_cluster_scales_and_stops_it():
    from jupyter_cluster.widgets.launcher import Launcher

    before = session.current()
    la = Launcher()
    la.name.value = "bad name!"
    assert la.start() is None
    assert "not a valid cluster name" in la.status.value and not la.start_button.disabled
    la.name.value = f"launched-{uuid.uuid4().hex[:4]}"
    la.backend.value = "local"
    la.workers.value = 1
    la.threads.value = 1
    la.memory_limit.value = "1GiB"
    handle = la.start()
    try:
        assert session.current() is handle and handle.name == la.name.value
        assert la.start_button.disabled and not la.stop_button.disabled
        view = la.view.children[0]
        assert isinstance(view, cluster_mod.ClusterWidget) and view.model_data["n_workers"] == 1
        assert view.model_data["workers"][0]["memory_limit"] == 2**30
        la.workers.value = 2
        la.scale()
        handle.wait_for_workers(2, timeout=60)
        assert "Scaling" in la.status.value
        started, version = la.static_bundle(), la.static_version()
        assert handle.name in started["text/plain"] and "jupyter-cluster-workers" in started["text/html"]
    finally:
        la.stop()
    assert handle.closed and "Stopped" in la.status.value
    assert not la.start_button.disabled and la.stop_button.disabled
    # once stopped, the copy says so and keeps the last table the cluster had
    stopped = la.static_bundle()
    assert "Stopped" in stopped["text/plain"] and "(stopped)" in stopped["text/plain"]
    assert "jupyter-cluster-workers" in stopped["text/html"]
    assert la.static_version() != version  # so the cell's end updates the saved copy
    if before is not None and not before.closed:
        session.connect(before.name)  # leave the module's cluster current


# -- metrics: text ----------------------------------------------------------------------------
def test_show_metrics_in_a_terminal_is_a_text_summary(ip):
    topic = unique_topic("txt")
    for step in range(3):
        telemetry.report(step=step, topic=topic, member=1, reward=float(step))
    telemetry.report(step=2, topic=topic, load=[4, 5, 6])
    view = ip.run_line_magic("cluster", f"metrics {topic}")
    assert isinstance(view, metrics_mod.MetricsText)
    text = repr(view)
    assert text.splitlines()[0] == f"metrics {topic!r}: 4 reports, 2 series, 0 dropped"
    assert "reward: member=1: 2 @ 2" in text
    assert "load[all] @ 2: [4, 5, 6] (3 entries)" in text


def test_metrics_magic_refuses_two_topics(ip):
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match=r"unrecognized arguments: b\.(.|\n)*%cluster metrics \[TOPIC\]"):
        ip.run_line_magic("cluster", "metrics a b")


def test_without_the_chart_bundle_a_kernel_gets_a_live_text_view_and_one_message(monkeypatch, tmp_path):
    monkeypatch.setattr(metrics_mod, "BUNDLE", tmp_path / "missing.js")
    monkeypatch.setattr(metrics_mod, "_widget_class", None)
    monkeypatch.setattr(context, "in_kernel", lambda: True)
    topic = unique_topic("nobundle")
    view = metrics_mod.show_metrics(topic)
    assert "widgets/static/metrics.js, which is not built" in view.value
    assert view.value.count("not built") == 1
    telemetry.report(step=1, topic=topic, acc=0.25)
    wait_for(lambda: "acc: all: 0.25 @ 1" in view.value, timeout=10, message="the text view to update")
    view.close()


# -- metrics: chart widget --------------------------------------------------------------------
def _train(member: int, topic: str, steps: int, pause: float):
    import time

    from jupyter_cluster import report

    for step in range(steps):
        report(step=step, topic=topic, member=member, reward=member + step / steps, tokens=[step % 4, member, 1.0])
        time.sleep(pause)
    return member


@pytest.fixture
def chart_class():
    if not metrics_mod.BUNDLE.is_file():
        pytest.skip("the chart bundle is not built (jlpm build:widget)")
    return metrics_mod.widget_class()


def test_metrics_widget_state_follows_a_real_map_live(cluster, chart_class):
    telemetry.attach(cluster.client)
    topic = unique_topic("live")
    w = chart_class(topic)
    pushes: list[float] = []
    w.observe(lambda change: pushes.append(time.monotonic()), names="data")
    mapping.map(functools.partial(_train, topic=topic, steps=40, pause=0.04), range(3), progress=False)
    wait_for(lambda: w.data.get("received") == 120, timeout=15, message="all reports in the widget")
    data = w.data
    assert data["topic"] == topic and data["dropped"] == 0
    assert sorted(data["scalars"]["reward"]) == ["member=0", "member=1", "member=2"]
    pts = data["scalars"]["reward"]["member=2"]
    assert [p[0] for p in pts] == list(range(40)) and pts[-1][1] == pytest.approx(2 + 39 / 40)
    heat = data["vectors"]["tokens"]["member=1"]
    assert heat["steps"] == list(range(40)) and heat["rows"][5] == [1.0, 1.0, 1.0]
    # live: several pushes while the map ran (the map lasts ~1.6 s), at least twice a second
    gaps = [b - a for a, b in zip(pushes, pushes[1:])]
    assert len(pushes) >= 3, pushes
    assert statistics.median(gaps) <= 0.6, gaps
    w.close()
    wait_for(lambda: not w.follower.alive(), timeout=5, message="the follower to stop")


def test_metrics_widget_payload_stays_bounded_for_100_series(chart_class):
    topic = unique_topic("wide")
    st = telemetry.store(topic)
    for member in range(100):
        st.add(
            f"src{member}",
            0,
            [
                {"step": s, "time": 0.0, "series": {"member": member}, "values": {"loss": 1.0 / (s + 1)}}
                for s in range(500)
            ],
        )
    w = chart_class(topic)
    series = w.data["scalars"]["loss"]
    assert len(series) == 100
    assert sum(len(p) for p in series.values()) <= 20_000 + 200
    w.close()


# -- a real kernel ------------------------------------------------------------------------------
def test_in_a_real_kernel_the_views_are_widgets():
    cells = [
        "import jupyter_cluster as jc\nfrom jupyter_cluster.tracking import progress\n%load_ext jupyter_cluster\n"
        "jc.report(step=1, topic='k', member=1, reward=1.0)",
        "jc.show_metrics('k')",
        "%cluster metrics k",
        "jc.launcher()",
        "print(type(progress.make_renderer()).__name__)",
    ]
    nb = run_notebook(cells, timeout=120)
    view = "application/vnd.jupyter.widget-view+json"
    for cell in nb.cells[1:4]:
        assert any(view in out.get("data", {}) for out in cell.outputs), cell.source
    assert nb.cells[4].outputs[0]["text"].strip() == "WidgetRenderer"


def test_saved_notebook_holds_every_chart_point_when_the_cell_ends_at_once(monkeypatch):
    """The chart state saved with the notebook (nbclient, as a save in JupyterLab) has the last
    points, from the notebook and from a map's tasks, although each cell ends right after its last
    report.  The ticker is slowed to 60 s, so only the flush at the end of a map / cell can send them."""

    monkeypatch.setenv("DASK_JUPYTER_CLUSTER__METRICS__REFRESH", "60s")
    monkeypatch.setenv("DASK_JUPYTER_CLUSTER__LOCAL__WORKERS", "1")
    cells = [
        "import jupyter_cluster as jc\n%load_ext jupyter_cluster\n%cluster start",
        "jc.show_metrics('nb')",
        "jc.show_metrics('tasks')",
        "for step in range(10):\n    jc.report(step=step, topic='nb', reward=step / 10)",
        "%%parallel step in range(6) --no-progress\njc.report(step=step, topic='tasks', loss=1 / (step + 1))",
        "%cluster stop",
    ]
    nb = run_notebook(cells, timeout=120, store_widget_state=True)
    states = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    charts = {m["state"]["topic"]: m["state"]["data"] for m in states.values() if "topic" in m.get("state", {})}
    assert [p[0] for p in charts["nb"]["scalars"]["reward"]["all"]] == list(range(10))
    assert sorted(p[0] for p in charts["tasks"]["scalars"]["loss"]["all"]) == list(range(6))


def test_metrics_table_time_is_a_datetime_column():
    """``metrics()`` gave ``time`` as float epoch seconds (1.796072e+09); it is a pandas datetime column."""
    import pandas as pd

    topic = unique_topic("when")
    before = pd.Timestamp.now(tz="UTC")
    telemetry.report(step=0, topic=topic, loss=1.0)
    telemetry.report(step=1, topic=topic, loss=0.5)
    df = telemetry.metrics(topic)
    assert pd.api.types.is_datetime64_any_dtype(df["time"])
    assert before - pd.Timedelta(seconds=1) <= df["time"].min() <= df["time"].max() <= pd.Timestamp.now(tz="UTC")
    assert pd.api.types.is_datetime64_any_dtype(telemetry.metrics(unique_topic("empty"))["time"])


def test_idle_leases_count_as_idle_not_as_running_tasks(cluster):
    """Between maps the engine's lease tasks stay "executing" in Dask's accounting: the notebook's
    widget counted them as running tasks, where the sidebar says idle."""
    from jupyter_cluster.wire.leases import LEASE_PREFIX

    assert mapping.map(abs, range(40), client=cluster.client) == list(range(40))
    processing = cluster.client.processing()
    leases = sum(1 for keys in processing.values() for k in keys if str(k).startswith(LEASE_PREFIX))
    if not leases:
        pytest.skip("no lease task outlived the map on this cluster (nothing to count apart)")
    # what the widget used to show as "tasks running" (the workers' heartbeats carry the counts)
    wait_for(
        lambda: sum(wk["executing"] for wk in cluster.model()["workers"]) >= leases,
        timeout=20,
        message="the scheduler counting the waiting leases as executing",
    )
    w = cluster_mod.ClusterWidget(cluster, live=False)

    def idle() -> bool:
        # (a worker's busy count comes with its next heartbeat: the last one may be from during the map)
        w.refresh()
        return _cells(w.table.value)[-1] == "0"

    wait_for(idle, timeout=20, message="the totals row counting no running task while the leases wait")
    assert "idle)" in w.table.value  # each worker's waiting leases, said apart
    w.close()
