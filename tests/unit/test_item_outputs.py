"""What items print, filed by one capture for both loops of a chunk (engine/worker/items.py), in-process."""

from __future__ import annotations

import sys
import time

import cloudpickle
import pytest

from jupyter_cluster.engine.protocol import MapRun
from jupyter_cluster.engine.worker import run as worker_run

_attempts: dict[int, int] = {}


def flaky(x):
    _attempts[x] = _attempts.get(x, 0) + 1
    print(f"item {x} attempt {_attempts[x]}")
    if x == 1 and _attempts[x] < 3:
        raise ValueError("not yet")
    return x


def sleepy(x):
    print(f"start {x}")
    if x == 1:
        time.sleep(5)
    return x


@pytest.fixture
def streams(monkeypatch):
    # Wrap the stdout pytest has now (a worker process wraps its own once), and restore it after.
    monkeypatch.setattr(sys, "stdout", sys.stdout)
    monkeypatch.setattr(sys, "stderr", sys.stderr)
    monkeypatch.setattr(worker_run._STATE, "streams_installed", False)


def _run(fn, items, retries=0, timeout=None):
    run = MapRun(f"outputs-{fn.__name__}-{id(items)}", cloudpickle.dumps(fn), False, retries, timeout, True)
    return worker_run.run_chunk(run, items)


def test_a_retried_item_keeps_only_its_last_attempts_output(streams):
    _attempts.clear()
    values, timings, outputs, errors, *_ = _run(flaky, [0, 1, 2], retries=2)
    assert values == [0, 1, 2] and errors is None
    assert outputs == {0: "item 0 attempt 1\n", 1: "--- retry 2 of 2 ---\nitem 1 attempt 3\n", 2: "item 2 attempt 1\n"}
    assert timings and sum(n for n, _ in timings) == 3


def test_an_item_over_its_timeout_keeps_its_output_and_the_next_item_its_own(streams):
    values, _timings, outputs, errors, *_ = _run(sleepy, [0, 1, 2], timeout=0.3)
    assert values[0] == 0 and values[2] == 2 and errors is not None and sorted(errors) == [1]
    assert outputs == {0: "start 0\n", 1: "start 1\n", 2: "start 2\n"}
