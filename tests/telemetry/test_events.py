"""report() from real workers and the notebook, arrival in the kernel, metrics(), bursts, drops."""

from __future__ import annotations

import functools
import time
import uuid

import pytest

from jupyter_cluster import telemetry
from jupyter_cluster.telemetry.producer import _producer
from jupyter_cluster.wire import models

from ..conftest import wait_for
from ..helpers import unique_topic


# -- validation (at the call, in the caller's process) ------------------------------------
@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"reward": {"a": 1}}, "value 'reward' is a dict"),
        ({"reward": "high", "run": "x"}, "give at least one value"),
        ({"loss": [[1, 2], [3, 4]]}, "flat"),
        ({"loss": [1, "x"]}, "must hold only numbers"),
        ({"loss": 1.0, "step": 1.5}, "step must be an integer"),
        ({"loss": 1.0, "step": "3"}, "step must be an integer"),
        ({"loss": 1.0, "topic": ""}, "topic must be a non-empty string"),
        ({"loss": 1.0, "topic": 3}, "topic must be a non-empty string"),
        ({"loss": 1.0, "series": ["member", 3]}, "series= must be a dict"),
        ({"loss": 1.0, "series": {"member": 1.5}}, "series field 'member' must be a string or an integer"),
        ({"loss": object()}, "value 'loss' is a object"),
    ],
)
def test_report_rejects_bad_values_with_one_clear_type_error(kwargs, fragment):
    with pytest.raises(TypeError, match=fragment.replace("[", r"\[")):
        telemetry.report(**kwargs)


def test_report_accepts_numpy_scalars_arrays_and_identity_fields():
    np = pytest.importorskip("numpy")
    step, series, values = telemetry.validate(
        np.int64(4),
        "t",
        None,
        {"member": 3, "run": "lr=0.1", "reward": np.float32(1.5), "load": np.arange(3), "ok": True},
    )
    assert step == 4 and type(step) is int
    assert series == {"member": 3, "run": "lr=0.1"}
    assert values == {"reward": 1.5, "load": [0.0, 1.0, 2.0], "ok": 1}
    with pytest.raises(TypeError, match=r"shape \(2, 2\)"):
        telemetry.validate(None, "t", None, {"m": np.zeros((2, 2))})
    assert telemetry.series_key({"run": "a", "member": 3}) == "member=3, run=a"
    assert telemetry.series_key({}) == "all"


def test_report_in_the_notebook_without_a_cluster_is_kept_locally():
    import jupyter_cluster as jc  # as a notebook reaches it: the package's report installs the kernel's sink

    topic = unique_topic("nb")
    for step in range(3):
        jc.report(step=step, topic=topic, member=1, reward=step * 2.0)
    jc.report(topic=topic, load=[1, 2, 3])
    df = jc.metrics(topic)
    assert list(df.columns[:3]) == ["step", "time", "worker"]
    assert df["reward"].tolist()[:3] == [0.0, 2.0, 4.0]
    assert df["member"].tolist()[:3] == [1, 1, 1]
    assert df["load"].iloc[3] == [1.0, 2.0, 3.0]
    assert set(df["worker"]) == {"kernel"}
    assert df.attrs["dropped"] == 0


# -- the store: duplicates, gaps, order, downsampling ---------------------------------------
def _recs(steps, member=0, **extra):
    return [{"step": s, "time": 0.0, "series": {"member": member}, "values": {"v": float(s), **extra}} for s in steps]


def test_store_drops_duplicates_and_counts_gaps_exactly():
    st = telemetry.TopicStore("t")
    assert st.add("a", 0, _recs(range(0, 10))) == 10
    assert st.add("a", 5, _recs(range(5, 15))) == 5  # overlap: only 10..14 are new
    assert st.add("a", 20, _recs(range(20, 25))) == 5  # 15..19 never arrive
    assert st.add("b", 3, _recs(range(3, 4), member=1)) == 1  # b's 0..2 never arrive
    assert st.received == 21
    assert st.dropped == 5 + 3
    assert st.add("a", 15, _recs(range(15, 20))) == 5  # late arrival fills the gap
    assert st.dropped == 3


def test_200000_reports_past_the_history_cap_count_their_evictions():
    """The cap evicted the oldest 100,000 rows with "0 dropped" and nothing else said (issue 25.6)."""
    st = telemetry.TopicStore("cap")
    assert st.history == 100_000  # the default cap
    for b in range(200):
        recs = [{"step": b * 1000 + i, "time": 0.0, "series": {}, "values": {"v": float(i)}} for i in range(1000)]
        st.add("a", b * 1000, recs)
    assert (st.received, st.dropped, st.evicted) == (200_000, 0, 100_000)
    rows = st.rows()
    assert len(rows) == 100_000 and rows[0]["step"] == 100_000  # the newest were kept
    model = st.model()
    assert model["truncated"] == st.truncated == 100_000  # the curve lost its first 100,000 points too
    assert model["scalars"]["v"]["all"][0][0] == 100_000
    assert "0 dropped, 100000 evicted (only the newest 100000 are kept)" in st.summary()
    summary = models.topic_summary(st)
    assert (summary["dropped"], summary["truncated"]) == (0, 100_000)
    # kept across a server restart (the snapshot), and still counting after it
    again = telemetry.TopicStore.restore(st.snapshot(max_points=100))
    assert again.model()["truncated"] == 100_000


def test_vectors_and_series_below_the_cap_are_not_truncated():
    st = telemetry.TopicStore("vcap", history=30, vector_history=10)
    for m in range(3):  # 3 series x 20 reports: 60 rows, each curve 20 points (under 30)
        st.add(f"s{m}", 0, [{"step": s, "time": 0.0, "series": {"member": m}, "values": {"v": 1.0}} for s in range(20)])
    assert (st.evicted, st.truncated) == (30, 0)  # the table lost rows, no curve lost points
    st.add("vec", 0, [{"step": s, "time": 0.0, "series": {}, "values": {"load": [s, 1]}} for s in range(25)])
    assert st.truncated == 15 and st.model()["vectors"]["load"]["all"]["steps"][0] == 15


def test_metrics_says_how_many_reports_the_history_cap_evicted(cluster):
    """Through a real cluster: the kernel's store keeps 50 reports of a topic (a small cap via dask.config)."""
    import dask

    client = cluster.client
    telemetry.attach(client)
    topic = unique_topic("evict")
    with dask.config.set({"jupyter-cluster.metrics.history": 50}):
        client.gather(client.map(_work, [0, 1], topic=topic, n=60, pure=False))
        wait_for(lambda: telemetry.sync() and telemetry.store(topic).received == 120, message="120 reports")
        df = telemetry.metrics(topic)
    assert len(df) == 50
    assert (df.attrs["dropped"], df.attrs["evicted"]) == (0, 70)
    model = telemetry.store(topic).model()
    assert model["truncated"] == 2 * 10  # each member's 60 loss points: twice cut by a tenth of the cap


def test_store_keeps_each_series_sorted_by_step_even_when_workers_interleave():
    st = telemetry.TopicStore("t")
    st.add("w1", 0, _recs([0, 2, 4]))
    st.add("w2", 0, _recs([1, 3, 5]))
    pts = st.model()["scalars"]["v"]["member=0"]
    assert [p[0] for p in pts] == [0, 1, 2, 3, 4, 5]


def test_model_carries_each_series_report_times_for_time_axes():
    st = telemetry.TopicStore("t")
    t0 = 1_700_000_000.0

    def rec(step, member=0, t=None):
        return {
            "step": step,
            "time": t0 + 10 * step if t is None else t,
            "series": {"member": member},
            "values": {"v": 1.0},
        }

    st.add("w1", 0, [rec(0), rec(2), rec(4)])
    st.add("w2", 0, [rec(1), rec(3), rec(0, member=1, t=t0 + 5), rec(1, member=1, t="late")])
    times = st.model()["times"]
    assert times["member=0"] == [[s, t0 + 10 * s] for s in range(5)]  # sorted by step like the points
    assert times["member=1"] == [[0, t0 + 5]]  # a report without a usable time adds none
    # long runs are thinned, first and last kept
    for s in range(5, 5000):
        st.add("w3", s, [rec(s)])
    thinned = st.model()["times"]["member=0"]
    assert len(thinned) <= 1001 and thinned[0] == [0, t0] and thinned[-1] == [4999, t0 + 49_990]


def test_model_of_100_series_is_downsampled_but_keeps_peaks():
    st = telemetry.TopicStore("big")
    n = 1000
    for member in range(100):
        recs = [
            {"step": s, "time": 0.0, "series": {"member": member}, "values": {"v": float(s % 97)}} for s in range(n)
        ]
        recs[567]["values"]["v"] = 1e6  # a spike must survive downsampling
        st.add(f"p{member}", 0, recs)
    t0 = time.perf_counter()
    model = st.model(max_points=20_000)
    elapsed = time.perf_counter() - t0
    series = model["scalars"]["v"]
    assert len(series) == 100
    total = sum(len(p) for p in series.values())
    assert total <= 20_000 + 100 * 2
    assert all(max(v for _, v in pts) == 1e6 for pts in series.values())
    assert all(pts[0][0] == 0 and pts[-1][0] == n - 1 for pts in series.values())
    assert elapsed < 2.0, f"downsampling 100 x {n} points took {elapsed:.2f} s"
    # unchanged columns are served from the cache
    t0 = time.perf_counter()
    st.model(max_points=20_000)
    assert time.perf_counter() - t0 < elapsed


def test_store_model_heatmap_rows_and_json_safe_values():
    st = telemetry.TopicStore("moe")
    recs = [
        {"step": s, "time": 0.0, "series": {}, "values": {"tokens": [s, 2 * s, float("nan")], "loss": float("inf")}}
        for s in range(5)
    ]
    st.add("x", 0, recs)
    m = st.model()
    assert m["vectors"]["tokens"]["all"]["steps"] == [0, 1, 2, 3, 4]
    assert m["vectors"]["tokens"]["all"]["rows"][2] == [2.0, 4.0, None]
    assert m["scalars"]["loss"]["all"][0] == [0, None]
    import json

    json.dumps(m, allow_nan=False)


def test_records_expands_a_batch_into_shared_interface_records():
    msg = {"topic": "t", "source": "s", "seq": 7, "records": _recs([1, 2]), "worker": "tcp://w"}
    out = telemetry.records("t", msg)
    assert [r["seq"] for r in out] == [7, 8]
    assert out[0]["topic"] == "t" and out[0]["worker"] == "tcp://w" and out[0]["series"] == {"member": 0}


# -- real workers -----------------------------------------------------------------------------
def _work(member: int, topic: str, n: int, pause: float = 0.0):
    import time

    t0 = time.perf_counter()
    for step in range(n):
        telemetry.report(step=step, topic=topic, member=member, loss=float(step), load=[member, step])
        if pause:
            time.sleep(pause)
    return time.perf_counter() - t0


def test_reports_from_workers_arrive_in_order_per_series(cluster):
    client = cluster.client
    telemetry.attach(client)
    topic = unique_topic("order")
    futures = client.map(_work, [0, 1, 2, 3], topic=topic, n=50, pause=0.001, pure=False)
    client.gather(futures)
    st = telemetry.store(topic)
    # a task's reports are flushed before its result, so they are here already
    assert st.received == 200
    df = telemetry.metrics(topic)
    assert len(df) == 200
    assert set(df["worker"]) <= set(client.scheduler_info()["workers"])
    for member, group in df.groupby("member"):
        assert group["step"].tolist() == list(range(50)), f"series member={member} out of order"
        assert group["loss"].tolist() == [float(s) for s in range(50)]
        assert group["load"].iloc[-1] == [float(member), 49.0]
    assert df.attrs["dropped"] == 0


def _report_where(i: int, topic: str) -> str:
    from distributed import get_worker

    telemetry.report(step=i, topic=topic, loss=float(i))
    return get_worker().address


def test_metrics_worker_column_names_the_worker_of_each_report_of_a_map(cluster):
    """A map's reports travel with its direct batches, which the scheduler cannot attribute: all NaN (issue 25.6)."""
    import jupyter_cluster as jc

    topic = unique_topic("where")
    ran_on = jc.map(functools.partial(_report_where, topic=topic), range(40), client=cluster, progress=False)
    # a batch's reports reach the scheduler before its result leaves the worker; sync brings them here
    wait_for(lambda: telemetry.sync() and telemetry.store(topic).received == 40, message="the map's 40 reports")
    df = telemetry.metrics(topic)
    assert len(df) == 40 and df["worker"].notna().all(), df["worker"].tolist()
    assert dict(zip(df["step"], df["worker"])) == dict(enumerate(ran_on))


def _report_half(i: int, topic: str) -> int:
    telemetry.report(step=i, topic=topic, value=i * 0.5)
    return i


def test_metrics_right_after_a_map_holds_every_report_of_it(cluster):
    """metrics() at once after map() missed the last batches still on their way from the scheduler (issue 25)."""
    import jupyter_cluster as jc

    for attempt in range(10):
        topic = unique_topic(f"after-map-{attempt}")
        assert jc.map(functools.partial(_report_half, topic=topic), range(8), client=cluster, progress=False) == list(
            range(8)
        )
        rows = telemetry.metrics(topic)
        assert sorted(rows["value"]) == [i * 0.5 for i in range(8)], (attempt, rows)


def test_sync_is_not_held_up_by_a_stopped_cluster_it_followed(cluster):
    """A stopped cluster's hub made every later sync() False, so waits for reports timed out (issue 25)."""
    import jupyter_cluster as jc

    telemetry.attach(cluster.client)
    other = jc.start(workers=1, threads=1, name=f"sync-gone-{uuid.uuid4().hex[:6]}")
    try:
        telemetry.attach(other.client)
    finally:
        other.stop()
    assert telemetry.sync()


def test_burst_of_10000_reports_from_two_workers_all_arrive(cluster):
    client = cluster.client
    telemetry.attach(client)
    topic = unique_topic("burst")
    workers = list(client.scheduler_info()["workers"])
    assert len(workers) == 2
    futures = [client.submit(_work, i, topic, 5000, pure=False, workers=[w]) for i, w in enumerate(workers)]
    durations = client.gather(futures)
    st = telemetry.store(topic)
    wait_for(lambda: st.received + st.dropped >= 10_000, timeout=20, message="10,000 reports")
    assert (st.received, st.dropped) == (10_000, 0)
    assert max(durations) < 10, durations
    for member, group in telemetry.metrics(topic).groupby("member"):
        assert group["step"].tolist() == list(range(5000)), f"series member={member} incomplete or out of order"


def _one_batch_per_report(topic: str, n: int) -> int:
    import time

    for step in range(n):
        telemetry.report(step=step, topic=topic, x=float(step))
        telemetry.flush()
        deadline = time.monotonic() + 5
        while _producer.pending and time.monotonic() < deadline:
            time.sleep(0.0002)
    return n


def test_late_subscriber_gets_the_schedulers_backlog_and_an_exact_dropped_count():
    import dask
    from distributed import Client, LocalCluster

    keep = 100  # events the scheduler keeps per topic (1,000 by default)
    with dask.config.set({"distributed.admin.low-level-log-length": keep}):
        small = LocalCluster(
            n_workers=1,
            threads_per_worker=1,
            processes=False,
            protocol="tcp://",
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
        )
    try:
        n = keep + 37
        topic = unique_topic("late")
        with Client(small, set_as_default=False) as producer_client:
            producer_client.submit(_one_batch_per_report, topic, n, pure=False).result()
        # a client (like the server extension's) subscribes only now
        with Client(small.scheduler_address, set_as_default=False) as other:
            stores: dict = {}
            seen: list = []
            hub = telemetry.Hub(other, stores=stores)
            hub.callbacks.append(seen.append)
            hub.attach()
            st = stores[topic]
            assert (st.received, st.dropped) == (keep, n - keep)
            assert [r["step"] for r in st.rows()] == list(range(n - keep, n))
            assert seen == [topic]
            hub.detach()
    finally:
        small.close()


def test_reports_made_in_the_notebook_reach_other_subscribers(cluster):
    from distributed import Client

    with Client(cluster.address, security=cluster.security, set_as_default=False) as other:
        stores: dict = {}
        hub = telemetry.Hub(other, stores=stores)
        hub.attach()
        topic = unique_topic("from-kernel")
        telemetry.report(step=1, topic=topic, member=5, acc=0.5)
        assert telemetry.store(topic).received == 1  # at once in this kernel
        wait_for(
            lambda: topic in stores and stores[topic].received == 1,
            timeout=10,
            message="the kernel's report at another client",
        )
        row = stores[topic].rows()[0]
        assert (row["step"], row["member"], row["acc"]) == (1, 5, 0.5)
        hub.detach()


# -- values msgpack cannot carry (issue 18.3) -----------------------------------------------
@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"loss": 1.0, "step": 2**64}, "step must be an integer from"),
        ({"loss": 1.0, "step": -(2**63) - 1}, "step must be an integer from"),
        ({"loss": 1.0, "member": 2**70}, "identity field 'member'"),
        ({"loss": 1.0, "series": {"member": 2**64}}, "series field 'member'"),
        ({"loss": 10**400}, "value 'loss' is an integer too large"),
        ({"loss": [1, 10**400]}, "value 'loss' contains an integer too large"),
        ({"loss": 1.0, "run": "bad \ud800"}, "identity field 'run' is not valid text"),
        ({"\ud800": 1.0}, "is not valid text"),
        ({"loss": 1.0, "topic": "t\ud800"}, "topic must be"),
    ],
)
def test_report_rejects_what_msgpack_cannot_send(kwargs, fragment):
    with pytest.raises(TypeError, match=fragment):
        telemetry.report(**kwargs)


def test_report_converts_huge_integer_values_to_floats():
    step, ident, values = telemetry.validate(
        3, "t", None, {"big": 2**100, "neg": -(2**70), "vec": [2**65, 1], "ok": 2**63}
    )
    assert values == {"big": float(2**100), "neg": float(-(2**70)), "vec": [float(2**65), 1.0], "ok": 2**63}
    assert type(values["big"]) is float and type(values["neg"]) is float and type(values["ok"]) is int


def _report_huge(x, topic):
    from jupyter_cluster import report

    report(topic=topic, v=2**100 if x == 5 else 1)
    return x


def test_a_huge_integer_reported_by_a_task_never_breaks_a_worker(cluster):
    """The issue's case: report(v=2**100) on one item hung the map and dropped every worker."""
    import jupyter_cluster as jc

    client = cluster.client
    telemetry.attach(client)
    topic = unique_topic("huge")
    n_workers = len(client.scheduler_info()["workers"])
    work = functools.partial(_report_huge, topic=topic)
    assert jc.map(work, range(10), client=client, progress=False) == list(range(10))
    assert len(client.scheduler_info()["workers"]) == n_workers
    st = telemetry.store(topic)
    wait_for(lambda: st.received == 10, timeout=20, message="all ten reports")
    assert max(r["v"] for r in st.rows()) == float(2**100) and st.dropped == 0
    assert jc.map(abs, [-1, -2], client=client, progress=False) == [1, 2]


def test_follow_replays_the_backlog_then_the_live_feed_each_event_once(cluster):
    """The one subscribe/replay helper (kernel Hub and server manager): no loss, no double, no markers."""
    client = cluster.client
    topic = unique_topic("jupyter-cluster:test-follow")
    for n in (0, 1):  # before anyone follows: only the scheduler's backlog has them
        client.log_event(topic, {"n": n})
    got: list = []
    seen: dict[str, float] = {}
    client.sync(telemetry.follow, client, topic, lambda dask_topic, msg: got.append(msg), seen=seen)
    assert got == [{"n": 0}, {"n": 1}]  # the backlog, replayed before follow() returns; its marker not handed on
    client.log_event(topic, {"n": 2})
    wait_for(lambda: len(got) == 3, 10, message="the live event")
    # following again (a reconnect) with the same `seen` hands on nothing twice
    client.sync(telemetry.follow, client, topic, lambda dask_topic, msg: got.append(msg), seen=seen)
    client.log_event(topic, {"n": 3})
    wait_for(lambda: len(got) == 4, 10, message="the live event after the second follow")
    client.log_event(topic, {"n": 4})  # events arrive in order: a double of 0-3 would come before this
    wait_for(lambda: {"n": 4} in got, 10, message="the last event")
    assert got == [{"n": n} for n in range(5)]
