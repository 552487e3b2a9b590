"""Jobs, runs and the sweep table through a real Jupyter server, from real notebook kernels.

The server starts the kernels for notebook sessions (``POST api/sessions``),
so each kernel knows its notebook as a Jupyter server tells it
(``JPY_SESSION_NAME``).  The server runs with small job budgets, so that a
third notebook flooding the cluster with maps is over its own budget within
seconds.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
import requests

from ..conftest import wait_for
from ..helpers import kernel_ok
from ..jupyter_process import JupyterProcess

pytestmark = pytest.mark.timeout(300)

#: finished jobs' JSON per notebook and in all on the server (a job message is ~0.6-1 KB)
OWNER_BYTES = 6000
TOTAL_BYTES = 40000

OWNER_SCRIPT = textwrap.dedent(
    """
    import sys, time
    import jupyter_cluster as jc

    if __name__ == "__main__":
        handle = jc.start(name=sys.argv[1], workers=2, threads=1, processes=False)
        print("ready", flush=True)
        while not handle.closed:
            time.sleep(0.1)
    """
)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs-root")
    env_keys = {
        "DASK_JUPYTER_CLUSTER__SERVER__JOBS_OWNER_BYTES": str(OWNER_BYTES),
        "DASK_JUPYTER_CLUSTER__SERVER__JOBS_BYTES": str(TOTAL_BYTES),
    }
    old = {k: os.environ.get(k) for k in env_keys}
    os.environ.update(env_keys)  # the server (and the kernels it starts) read them at start
    script = root / "owner.py"
    script.write_text(OWNER_SCRIPT)
    owner = subprocess.Popen([sys.executable, str(script), "runs-c"], stdout=subprocess.PIPE, text=True, cwd=str(root))
    server = None
    try:
        assert owner.stdout is not None and owner.stdout.readline().strip() == "ready"
        server = JupyterProcess(str(root), app="server").start(timeout=120)
        yield server
    finally:
        if server is not None:
            for s in requests.get(f"{server.url}api/sessions", headers=server.headers, timeout=30).json():
                requests.delete(f"{server.url}api/sessions/{s['id']}", headers=server.headers, timeout=60)
            server.stop()
        owner.terminate()
        owner.wait(30)
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def notebook_kernel(server: JupyterProcess, path: str):
    """A kernel the server starts for the notebook ``path``, and a client to it."""
    from jupyter_client import BlockingKernelClient
    from jupyter_core.paths import jupyter_runtime_dir

    r = requests.post(
        f"{server.url}api/sessions",
        headers=server.headers,
        json={"path": path, "name": path, "type": "notebook", "kernel": {"name": "python3"}},
        timeout=60,
    )
    assert r.status_code == 201, r.text
    kernel_id = r.json()["kernel"]["id"]
    kc = BlockingKernelClient(connection_file=os.path.join(jupyter_runtime_dir(), f"kernel-{kernel_id}.json"))
    kc.load_connection_file()
    kc.start_channels()
    deadline = time.monotonic() + 120
    while True:  # the server starts the kernel asynchronously: its heartbeat may not answer at first
        try:
            kc.wait_for_ready(timeout=30)
            break
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    kernel_ok(kc, "%load_ext jupyter_cluster\n%cluster connect runs-c", timeout=120)
    return kc, kernel_id


def api(server: JupyterProcess, path: str, **params) -> dict:
    r = requests.get(server.api(path), headers=server.headers, params=params, timeout=60)
    assert r.status_code == 200, f"{path}: {r.status_code} {r.text}"
    return r.json()


SWEEP_A = """%%parallel x in range(3) --errors collect --sweep
import jupyter_cluster as jc
jc.report(step=0, topic="runs-a", score=10.0 * x)
jc.report(step=1, topic="runs-a", score=10.0 * x + 1, config={"double": 2 * x})
if x == 1:
    raise ValueError("item one fails")
x
"""


def test_two_notebooks_keep_their_jobs_and_runs_while_a_third_floods(setup):
    server = setup
    kcs = []
    try:
        a, _ = notebook_kernel(server, "runs-a.ipynb")
        b, kernel_b = notebook_kernel(server, "sub/runs-b.ipynb")
        flood, _ = notebook_kernel(server, "runs-flood.ipynb")
        kcs = [a, b, flood]
        kernel_ok(a, SWEEP_A)
        kernel_ok(b, "import jupyter_cluster as jc\njc.map(abs, [-1, -2, -3])")

        def mine(nb):
            return [j for j in api(server, "jobs", notebook=nb, cluster="runs-c")["recent"]]

        a_jobs = wait_for(lambda: mine("runs-a.ipynb"), 30, message="runs-a.ipynb's job on the server")
        b_jobs = wait_for(lambda: mine("sub/runs-b.ipynb"), 30, message="b.ipynb's job on the server")
        out = kernel_ok(
            flood,
            "import jupyter_cluster as jc\nfor i in range(40):\n    jc.map(abs, [i])\nfrom jupyter_cluster.tracking.record import kept_jobs\nprint(kept_jobs()[-1]['job'])",
        )
        last = out.strip().splitlines()[-1]
        wait_for(
            lambda: last in {j["job"] for j in api(server, "jobs", notebook="runs-flood.ipynb")["recent"]},
            30,
            message="the flood's last job on the server",
        )

        # the quiet notebooks' jobs are all still there, with their context
        [ja] = mine("runs-a.ipynb")
        assert ja == a_jobs[0] or ja["job"] == a_jobs[0]["job"]
        assert ja["failed"] == 1 and "ValueError: item one fails" in ja["failures"][0]["error"]
        assert ja["notebook"] == "runs-a.ipynb" and ja["cell"]["first_line"].startswith("%%parallel x in range(3)")
        assert ja["kind"] == "map" and ja["item_count"] == 3 and "items" not in ja  # the job list leaves items out
        assert ja["name"] == f"runs-a.ipynb · In [{ja['cell']['execution_count']}] · %%parallel x in range(3)"
        assert ja["duration"] > 0
        assert [j["job"] for j in mine("sub/runs-b.ipynb")] == [b_jobs[0]["job"]]
        assert b_jobs[0]["kernel_id"] == kernel_b
        # the flood kept only what its own budget holds
        flooded = api(server, "jobs", notebook="runs-flood.ipynb")["recent"]
        assert 2 <= len(flooded) < 40
        assert sum(len(str(j)) for j in flooded) < 2 * OWNER_BYTES
        # the unfiltered list has every notebook's jobs
        listed = {j["job"] for j in api(server, "jobs")["recent"]}
        assert ja["job"] in listed and b_jobs[0]["job"] in listed

        # runs: a.ipynb's one run, its sweep table the same as jc.runs() in its kernel
        [run] = api(server, "runs", notebook="runs-a.ipynb")["runs"]
        assert run["name"].startswith("runs-a.ipynb · In [") and run["metrics"] == ["score"]
        assert (run["total"], run["done"], run["failed"], run["cluster"]) == (3, 2, 1, "runs-c")
        detail = api(server, f"runs/{run['run']}")
        rows = detail["rows"]
        assert [r["state"] for r in rows] == ["finished", "failed", "finished"]
        assert [r["config"] for r in rows] == [{"x": 0, "double": 0}, {"x": 1, "double": 2}, {"x": 2, "double": 4}]
        assert [r["final"]["score"] for r in rows] == [1.0, 11.0, 21.0]
        assert detail["columns"] == {"config": ["x", "double"], "metrics": ["score"]}
        curves = api(server, f"runs/{run['run']}/curves")["curves"]
        assert curves == {"score": {f"x={x}": [[0, 10.0 * x], [1, 10.0 * x + 1]] for x in range(3)}}
        out = kernel_ok(
            a,
            "import json, jupyter_cluster as jc\n"
            "df = jc.runs(notebook='runs-a.ipynb')\n"
            "print(json.dumps(df[['item', 'state', 'x', 'double', 'score', 'score.best']].astype(object).values.tolist()))",
        )
        import json

        assert json.loads(out.strip().splitlines()[-1]) == [
            [r["item"], r["state"], r["config"]["x"], r["config"]["double"], r["final"]["score"], r["best"]["score"]]
            for r in rows
        ]
        assert api(server, "runs", notebook="sub/runs-b.ipynb")["runs"][0]["notebook"] == "sub/runs-b.ipynb"
        r = requests.get(server.api("runs/nope"), headers=server.headers, timeout=30)
        assert r.status_code == 404 and "no run 'nope'" in r.json()["message"]
        r = requests.get(server.api("jobs"), headers=server.headers, params={"kernel": "../x"}, timeout=30)
        assert r.status_code == 400
    finally:
        for kc in kcs:
            kc.stop_channels()


def test_runs_and_jobs_refuse_unauthenticated_requests(setup):
    server = setup
    for path, params in (
        ("runs", {}),
        ("runs/abc", {}),
        ("runs/abc/curves", {}),
        ("jobs", {"notebook": "runs-a.ipynb"}),
    ):
        r = requests.get(server.api(path), params=params, timeout=30)
        assert r.status_code == 403, (path, r.status_code)
        r = requests.get(server.api(path), params=params, headers={"Authorization": "token wrong"}, timeout=30)
        assert r.status_code == 403, (path, r.status_code)


def _job(job: str, run: str, state: str, updated: float) -> dict:
    from jupyter_cluster.wire.models import job_message

    msg = dict(job_message(job, "f", None, "slow", 1, int(state != "running"), 0, state, updated - 1, updated))
    msg.update(run=run, kind="map", notebook="slow.ipynb", cell=None, config={}, context={})
    return msg


async def test_a_run_published_before_the_server_subscribed_to_a_slow_scheduler_is_listed():
    """A scheduler too slow to answer within a panel action's wait still gives the server its runs.

    The map's job messages are at the scheduler before the server connects (a cell right after
    ``%cluster start``), so the server hears of them only from the scheduler's backlog.  The
    scheduler answers the backlog request late (a loaded machine); a panel action waiting for the
    connection (``reach``) gives up first.  Before the fix that cancelled the subscription
    halfway: the client counted as connected, the backlog was never read and every later job
    message was held back for ever, so the run was never listed.
    """
    import asyncio

    from distributed import Client, Scheduler

    from jupyter_cluster.server.connection import Connection
    from jupyter_cluster.state import registry
    from jupyter_cluster.telemetry.topic_names import JOBS_TOPIC

    async with Scheduler(host="127.0.0.1", port=0, dashboard=False) as s:
        async with Client(s.address, asynchronous=True) as kernel:
            await kernel.log_event(JOBS_TOPIC, _job("j1", "run-early", "finished", time.time()))
            answer = s.handlers["events"]

            async def late_events(**kwargs):
                await asyncio.sleep(1.5)
                return answer(**kwargs)

            s.handlers["events"] = late_events
            conn = Connection(registry.ClusterRecord(name="slow", backend="address", address=s.address, attached=True))
            try:
                await conn.reach(timeout=0.3)  # the panel's action stops waiting; the connection must go on
                deadline = time.monotonic() + 30
                while "j1" not in conn.jobs.jobs and time.monotonic() < deadline:
                    await conn.tick()  # what the server's refresh loop does every 0.5 s
                    await asyncio.sleep(0.2)
                assert "j1" in conn.jobs.jobs, f"the backlog's job never arrived ({conn.status}, {conn.error})"
                await kernel.log_event(JOBS_TOPIC, _job("j2", "run-late", "running", time.time()))
                for _ in range(300):  # live now: within a moment
                    if "j2" in conn.jobs.jobs:
                        break
                    await asyncio.sleep(0.1)
                assert {r["run"] for r in conn.jobs.runs().values()} == {"run-early", "run-late"}
            finally:
                await conn.close()
