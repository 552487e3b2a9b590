"""Progress of real maps: counts under failures and retries, renderers, delay, the jobs topic."""

from __future__ import annotations

import io
import os
import time
import types

import pytest

from jupyter_cluster import mapping, telemetry
from jupyter_cluster.tracking import progress

from ..conftest import wait_for


@pytest.fixture(autouse=True)
def text_renderer():
    progress.set_renderer("text")
    yield
    progress.set_renderer(None)


@pytest.fixture
def jobs(cluster):
    """Job messages received by a subscriber to the jobs topic (as the server extension would)."""
    from distributed import Client

    got: list[dict] = []
    with Client(cluster.address, security=cluster.security, set_as_default=False) as other:
        other.subscribe_topic(telemetry.JOBS_TOPIC, lambda ev: got.append(ev[1]))
        # the subscription is effective once a message of our own comes back
        wait_for(
            lambda: (
                other.log_event(telemetry.JOBS_TOPIC, {"job": "probe"}) or any(m.get("job") == "probe" for m in got)
            ),
            timeout=10,
            message="jobs subscription",
        )
        yield got


def _last(jobs: list[dict], job_id: str) -> dict:
    return [m for m in jobs if m.get("job") == job_id][-1]


def _flaky(path_and_x):
    """Fails with ValueError for multiples of 7; fails once, then succeeds, for x == 3."""
    path, x = path_and_x
    import os
    import time

    time.sleep(0.005)
    if x % 7 == 0:
        raise ValueError(f"bad {x}")
    if x == 3:
        marker = os.path.join(path, "tried-3")
        if not os.path.exists(marker):
            open(marker, "w").close()
            raise RuntimeError("first attempt fails")
    return x


def test_counts_are_exact_under_failures_and_retries(cluster, jobs, tmp_path):
    items = [(str(tmp_path), x) for x in range(60)]
    out = mapping.map(_flaky, items, errors="collect", retries=1, label="flaky", progress=False)
    obs = progress.recent[-1]
    job = mapping.last_job()
    assert obs.job is job
    failing = [x for x in range(60) if x % 7 == 0]
    assert [type(r) for r in out if isinstance(r, Exception)] == [ValueError] * len(failing)
    assert out[3] == 3  # the retry succeeded and counted once
    snap = obs.model.snapshot()
    assert (snap["total"], snap["done"], snap["failed"], snap["processed"]) == (60, 60 - len(failing), len(failing), 60)
    assert snap["state"] == "finished" and snap["eta"] is None
    assert not obs.shown  # progress=False: nothing rendered
    wait_for(
        lambda: any(m.get("job") == job.id and m.get("state") == "finished" for m in jobs),
        timeout=10,
        message="final job message",
    )
    last = _last(jobs, job.id)
    assert (last["total"], last["done"], last["failed"]) == (60, 60 - len(failing), len(failing))
    assert last["label"] == "flaky" and last["kernel"] == os.getpid() and last["cluster"] == cluster.name
    assert last["kernel_id"] is None  # this process is no Jupyter kernel (a kernel's id: test_registry, tests/ui)
    assert last["updated"] >= last["started"]
    # the first five failures, each with its index, one-line error, traceback tail and worker
    assert [f["index"] for f in last["failures"]] == failing[:5]
    for f in last["failures"]:
        assert f["error"] == f"ValueError: bad {f['index']}"
        assert "ValueError" in f["traceback"] and len(f["traceback"]) <= 300
        assert f["worker"].startswith(("tcp://", "tls://", "inproc://"))
    first = [m for m in jobs if m.get("job") == job.id][0]
    assert first["state"] == "running" and first["done"] == 0


def _boom(x):
    if x == 5:
        raise KeyError("five")
    return x


def test_a_failing_map_ends_failed_in_the_display_and_on_the_topic(cluster, jobs, capsys):
    with pytest.raises(KeyError):
        mapping.map(_boom, range(20), label="boom", progress=True)
    obs = progress.recent[-1]
    assert obs.model.snapshot()["state"] == "failed"
    assert obs.shown  # progress=True renders at once
    assert "boom:" in capsys.readouterr().out
    job_id = obs.job.id
    wait_for(
        lambda: any(m.get("job") == job_id and m["state"] == "failed" for m in jobs),
        timeout=10,
        message="failed job message",
    )


def test_quick_maps_show_nothing_slow_ones_show_one_line(cluster, capsys):
    mapping.map(abs, range(10), label="quick")
    assert not progress.recent[-1].shown
    assert "quick" not in capsys.readouterr().out

    def slow(x):
        import time

        time.sleep(0.05)
        return x

    mapping.map(slow, range(40), label="slow")
    obs = progress.recent[-1]
    assert obs.shown and obs.model.snapshot()["elapsed"] > 1.0
    out = capsys.readouterr().out
    final = out.rstrip("\n").split("\r")[-1]
    assert final.startswith("slow: [####################] 40/40 (100 %)")
    assert "elapsed" in final and final.strip().endswith("finished")
    assert out.endswith("\n") and out.count("\n") == 1  # one line, rewritten in place


def test_widget_renderer_state_after_a_real_map(cluster):
    progress.set_renderer("widget")
    mapping.map(abs, range(25), label="widgety", progress=True)
    obs = progress.recent[-1]
    r = obs.renderer
    assert isinstance(r, progress.WidgetRenderer)
    assert (r.bar.value, r.bar.max, r.bar.bar_style) == (25, 25, "success")
    assert "widgety: 25/25 (100 %)" in r.label.value and "finished" in r.label.value

    def gen():
        yield from range(12)

    mapping.map(abs, gen(), label="unknown-length", progress=True)
    r = progress.recent[-1].renderer
    assert r.bar.value == 12 and r.bar.max == 12  # the total becomes known at the end
    assert "12/12" in r.label.value


def _fails_on_multiples_of_four(x):
    if x % 4 == 3:
        raise ValueError(f"bad item {x}")
    return x


def test_a_map_that_collected_failures_is_red_in_the_notebook_not_green(cluster):
    """--errors collect with 3 failures: the notebook's bar was all green (amber live), the panel's red."""
    progress.set_renderer("widget")
    mapping.map(_fails_on_multiples_of_four, range(12), errors="collect", label="collecting", progress=True)
    obs = progress.recent[-1]
    snap = obs.model.snapshot()
    assert (snap["state"], snap["done"], snap["failed"]) == ("finished", 9, 3)
    assert obs.renderer.bar.bar_style == "danger"
    page = progress.WidgetRenderer.static(snap)["text/html"]
    assert "class='jc-failed'" in page and "width:25%;background:#d9534f" in page  # 3 of 12 red
    assert "width:75%;background:#5cb85c" in page  # the 9 good ones green
    clean = progress.WidgetRenderer.static({**snap, "failed": 0, "done": 12})["text/html"]
    assert "jc-failed" not in clean


def test_failures_in_a_job_message_are_bounded():
    from jupyter_cluster.wire import models

    long = "x" * 1000
    job = types.SimpleNamespace(
        errors={i: ValueError(f"bad {i}\nsecond line {long}") for i in range(9, 0, -1)},
        tracebacks={i: (f"Traceback:\n  frame\n{long}\nValueError: bad {i}\n", None) for i in range(1, 10)},
        failed_items={i: (i, f"tcp://w{i}") for i in range(1, 10)},
    )
    got = progress.failures_of(job)
    assert [f["index"] for f in got] == [1, 2, 3, 4, 5]
    assert got[0]["error"] == "ValueError: bad 1" and got[0]["worker"] == "tcp://w1"
    assert len(got[0]["traceback"]) == models.MAX_FAILURE_TEXT and got[0]["traceback"].endswith("ValueError: bad 1")
    assert progress.failures_of(types.SimpleNamespace()) == []
    # the server keeps only well-formed failures, clipped
    raw = [{"index": True}, "junk", {"index": 3, "error": long, "worker": 7}, {"index": 4}]
    checked = models.job_failures(raw)
    assert [f["index"] for f in checked] == [3, 4]
    assert len(checked[0]["error"]) == models.MAX_FAILURE_TEXT and checked[0]["worker"] == "7"
    assert checked[1] == {"index": 4, "error": "", "traceback": "", "worker": None, "item": None}
    extra = [models.job_failure(0, "KeyError: 'a'"), models.job_failure(20, "KeyError: 'b'")]
    msg = models.job_message("j", "f", 1, "c", 9, 0, 9, "failed", 0.0, 1.0, got[::-1] + extra)
    assert [f["index"] for f in msg["failures"]] == [0, 1, 2, 3, 4]


def test_the_kernel_id_of_a_job_message_is_checked_by_the_server():
    from jupyter_cluster.server.jobs import JobsStore

    store = JobsStore()
    base = {"label": "f", "total": 1, "done": 0, "failed": 0, "state": "running", "started": 1.0, "updated": 1.0}
    store.add(dict(base, job="a", kernel_id="5f0c2a9e-1b7d-4c1e-9a43-2f6e8d0b7c11"))
    store.add(dict(base, job="b", kernel_id="../x y"))
    store.add(dict(base, job="c", kernel_id=["not", "a", "string"]))
    assert {j: m["kernel_id"] for j, m in store.jobs.items()} == {
        "a": "5f0c2a9e-1b7d-4c1e-9a43-2f6e8d0b7c11",
        "b": None,
        "c": None,
    }


def test_model_and_line_while_running_with_unknown_total():
    job = types.SimpleNamespace(
        id="j", label="gen", total=None, done=30, failed=2, started=time.time() - 4, finished=False, state="running"
    )
    snap = progress.JobProgress(job).snapshot()
    assert snap["eta"] is None and snap["processed"] == 32
    assert 7.0 < snap["rate"] < 9.0
    line = progress.format_line(snap)
    assert line.startswith("gen: 32 done | 2 failed | 8.0/s | elapsed 0:04")
    job.total = 64
    line = progress.format_line(progress.JobProgress(job).snapshot())
    assert "32/64 (50 %)" in line and "ETA 0:04" in line


def test_text_renderer_pads_a_shorter_line():
    buf = io.StringIO()
    r = progress.TextRenderer(buf)
    snap = dict(
        label="x", total=None, done=1000, failed=1, processed=1001, rate=1.0, elapsed=1.0, eta=None, state="running"
    )
    r.update(snap)
    r.update(dict(snap, processed=5, failed=0))
    first, second = buf.getvalue().split("\r")[1:]
    assert len(second) == len(first)


def test_a_failed_items_traceback_names_the_cell_and_the_item_by_its_value(ip, cluster):
    """The panel's traceback read ``File "<dynamic-code>"`` (or the kernel's temporary file), the item its index."""
    ip.run_cell("def bad_item(x):\n    if x == 'b':\n        raise ValueError('no b')\n    return x\n")
    count = ip.compile._filename_map[ip.user_ns["bad_item"].__code__.co_filename]
    mapping.map(ip.user_ns["bad_item"], ["a", "b", "c"], errors="collect", client=cluster.client, progress=False)
    (failure,) = progress.failures_of(mapping.last_job())
    assert failure["index"] == 1 and failure["item"] == "'b'", failure
    assert f"Cell In[{count}], line 3, in bad_item" in failure["traceback"], failure["traceback"]
    assert "<dynamic-code>" not in failure["traceback"]


def test_cell_names_leaves_other_files_alone(ip):
    from jupyter_cluster.tracking.cell_names import cell_names

    ip.run_cell("def named_here():\n    pass\n")
    path = ip.user_ns["named_here"].__code__.co_filename
    n = ip.compile._filename_map[path]
    text = f'  File "{path}", line 2, in named_here\n  File "/usr/lib/python3/x.py", line 9, in g\n'
    assert (
        cell_names(text, ip) == f'  Cell In[{n}], line 2, in named_here\n  File "/usr/lib/python3/x.py", line 9, in g\n'
    )
    assert cell_names(text, object()) == text  # no shell: as it was
