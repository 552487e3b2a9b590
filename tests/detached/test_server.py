"""The panel's REST view of detached work: jobs with progress and cell, kept clusters' countdown, Cancel;
a Jupyter server restart in the middle of a detached job changes nothing for it."""

from __future__ import annotations

import json
import math
import os
import time

import pytest
import requests

import jupyter_cluster as jc

from ..conftest import wait_for
from ..jupyter_process import JupyterProcess

pytestmark = pytest.mark.slow


def sleepy(x):
    time.sleep(5)
    return x


def _get(server, path):
    r = requests.get(server.api(path), headers=server.headers, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def test_rest_lists_detached_jobs_and_kept_clusters_across_a_server_restart(tmp_path, ip, monkeypatch):
    # the server's own (panel) clusters idle out after 4 s; the kept one below sets its own timeout
    monkeypatch.setenv("DASK_JUPYTER_CLUSTER__DETACHED__IDLE_TIMEOUT", "4s")
    server = JupyterProcess(str(tmp_path)).start()
    handle = None
    try:
        handle = jc.start(keep=True, workers=2, idle_timeout=300, name="srv-k")
        # the submitting kernel's notebook (as a Jupyter server names it) and cell: the host has neither
        monkeypatch.setenv("JPY_SESSION_NAME", str(tmp_path / "srv-sweeps.ipynb"))
        ip.run_cell(
            "%%parallel x in range(12) --detach srv-job --chunksize 1\n"
            "import time, jupyter_cluster\ntime.sleep(0.3)\njupyter_cluster.report(step=x, score=float(x))\n-x",
            store_history=True,
            cell_id="detached-cell-1",
        ).raise_error()
        job = jc.job("srv-job")
        data = _get(server, "detached")
        row = next(j for j in data["jobs"] if j["name"] == "srv-job")
        assert row["cluster"] == "srv-k" and row["total"] == 12 and row["state"] in ("running", "finished")
        assert "jc.job('srv-job').result()" in row["fetch_code"]
        wait_for(
            lambda: (
                [a["pid"] for k in _get(server, "detached")["kept"] if k["name"] == "srv-k" for a in k["attached"]]
                == [os.getpid()]
            ),
            10,
            message="this process listed as attached",
        )
        kept = next(k for k in _get(server, "detached")["kept"] if k["name"] == "srv-k")
        assert kept["idle_timeout"] == 300 and kept["stops_in"] is None  # attached, busy: no countdown

        server.stop()  # the Jupyter server restarts while the job runs
        server = JupyterProcess(str(tmp_path)).start()
        assert job.result(timeout=120) == [-x for x in range(12)]
        row = next(j for j in _get(server, "detached")["jobs"] if j["name"] == "srv-job")
        assert row["state"] == "finished" and row["done"] == 12
        # the sweep's run, with its curves, as the panel reads it (reported while no kernel waited on it)
        run = wait_for(
            lambda: next(
                (r for r in _get(server, "runs")["runs"] if r["label"].endswith("--detach srv-job") and r["metrics"]),
                None,
            ),
            30,
            message="the detached sweep's run",
        )
        assert run["state"] == "finished" and run["cluster"] == "srv-k" and run["metrics"] == ["score"], run
        # its notebook and cell are the submitting kernel's, so the panel links to them as for any run
        assert run["notebook"] == "srv-sweeps.ipynb" and run["cell"]["cell_id"] == "detached-cell-1", run
        assert run["cell"]["first_line"].startswith("%%parallel x in range(12) --detach srv-job"), run
        assert run["name"].startswith("srv-sweeps.ipynb · In ["), run
        assert [r["run"] for r in _get(server, "runs?notebook=srv-sweeps.ipynb")["runs"]] == [run["run"]]

        # and jc.runs() in a kernel of that notebook lists it (a plain map over range(): one row), with its reports
        def runs_row() -> dict | None:  # its reports reach this kernel's topic store a little after the server's
            table = jc.runs()
            rows = table[table["run"] == run["run"]].to_dict("records")
            # another topic of this process with a "score" metric (an earlier test's) makes the columns
            # name their topic: "default/score.best"
            best = rows[0].get("score.best", rows[0].get("default/score.best")) if rows else None
            if best is None or math.isnan(best):  # its reports are not here yet
                return None
            return {**rows[0], "score.best": best}

        row = wait_for(runs_row, 30, interval=0.5, message="the run's row in jc.runs(), with its reports")
        assert row["state"] == "finished" and row["notebook"] == str(tmp_path / "srv-sweeps.ipynb"), row
        assert row["cell"] == run["cell"]["execution_count"] and row["score.best"] == 11.0, row
        curves = _get(server, f"runs/{run['run']}/curves")
        assert "score" in json.dumps(curves), curves

        handle.close()  # nothing attached, nothing running: the countdown shows
        wait_for(
            lambda: (next(k for k in _get(server, "detached")["kept"] if k["name"] == "srv-k")["stops_in"] or 0) > 0,
            30,
            message="the idle countdown",
        )
        long = jc.submit(sleepy, range(20), name="srv-long", cluster="srv-k")
        r = requests.post(server.api("detached/srv-long/cancel"), headers=server.headers, timeout=30)
        assert r.status_code == 200 and r.json()["state"] == "cancelled", r.text
        assert long.status == "cancelled"
        r = requests.post(server.api("detached/nope/cancel"), headers=server.headers, timeout=30)
        assert r.status_code == 404 and "no detached job named 'nope'" in r.json()["message"]
        r = requests.get(server.api("detached"), timeout=10)  # no token
        assert r.status_code == 403

        # the panel's New: a kept cluster too, that stops itself once idle (no zombie clusters)
        r = requests.post(server.api("clusters"), headers=server.headers, json={"name": "srv-panel", "workers": 1})
        assert r.status_code == 201 and r.json()["cluster"]["kept"] is True, r.text
        wait_for(
            lambda: jc.cluster.session.registry.read("srv-panel") is None, 60, message="the idle panel cluster to stop"
        )
    finally:
        for h in jc.cluster.session.handles():
            h.close()
        if jc.cluster.session.registry.read("srv-k") is not None:
            jc.stop("srv-k")
        server.stop()
