"""The benchmark scripts run end to end on a tiny scale (a smoke test, not a benchmark).

Numbers are not checked (they depend on the machine); what is checked is that
every stage ran, every result was correct and nothing was left running.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "benchmarks")

# generous: a smoke test checks that every stage ran, and a slow CI machine must not fail it
pytestmark = pytest.mark.timeout(300)


def test_bench_peers_quick_runs_end_to_end(tmp_path):
    out = tmp_path / "peers.json"
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(BENCH, "bench_peers.py"),
            "--quick",
            "--scale",
            "0.01",
            "--systems",
            "mp,jc-map",
            "--workloads",
            "noop,sleep10ms,bigarray",
            "--big-mb",
            "2",
            "--netns",
            "off",
            "--scratch",
            str(tmp_path / "scratch"),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    summary = data["summary"]
    assert set(summary) == {"mp", "jc-map"}
    for system in ("mp", "jc-map"):
        assert summary[system]["errors"] == []
        assert summary[system]["leaked_pids"] == []
        assert summary[system]["workloads"]["noop"]["correct"]
        assert summary[system]["workloads"]["sleep10ms"]["correct"]
    big = summary["jc-map"]["workloads"]["bigarray"]
    assert big["correct"]
    assert big["deserialisations"] >= 1
    # The report names the baseline ratio and the machine it ran on.
    assert "Wall time ÷ `mp`" in proc.stdout
    assert "CPUs" in proc.stdout


def test_scale_sim_quick_runs_end_to_end(tmp_path):
    out = tmp_path / "scale.json"
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(BENCH, "scale_sim.py"),
            "--workers",
            "4",
            "--iterations",
            "2",
            "--per-host",
            "4",
            "--rollout-ms",
            "5",
            "--engines",
            "jc,dask",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [(r["engine"], r["workers"]) for r in rows] == [("jc", 4), ("dask", 4)]
    for r in rows:
        assert r["iteration_s"] > 0 and 0 < r["efficiency"] <= 1.5
        assert r["tasks_per_s"] > 0


STARTUP_CASES = ("jc", "jc spawn", "jc after load_ext", "kernel", "dask", "mp fork", "mp spawn")


# 12-47 s (seven child interpreters, a kernel among them); what each case starts is tested in the fast layer
# (tests/cluster/test_startup.py, test_scripts.py, the kernel tests): here only that the script runs
@pytest.mark.slow
def test_startup_runs_every_case_and_prints_its_table():
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(BENCH, "startup.py"),
            "--workers",
            "1",
            "--repeat",
            "1",
            "--cases",
            ",".join(STARTUP_CASES),
        ],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "| case | import | first start |" in proc.stdout, proc.stdout
    # One row per case, each with a measured first start: a case that failed
    # in its child interpreter would be missing or carry no number.
    rows = {}
    for line in proc.stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 8 and cells[0] in STARTUP_CASES:
            rows[cells[0]] = cells
    assert set(rows) == set(STARTUP_CASES), proc.stdout
    for case, cells in rows.items():
        assert float(cells[2]) > 0, (case, cells)
    # The report names the machine it ran on.
    assert "CPUs" in proc.stdout
