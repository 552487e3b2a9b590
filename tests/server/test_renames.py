"""A renamed notebook keeps its work: the server follows its session's path (and the kernel its new name).

JupyterLab renames a notebook by changing its session's path (``PATCH
api/sessions/<id>``); the kernel keeps the path it started with.  A real
server, a real notebook kernel with a cluster of its own.
"""

from __future__ import annotations

import json
import os
import time

import pytest
import requests

from ..conftest import wait_for
from ..helpers import kernel_ok
from ..jupyter_process import JupyterProcess

pytestmark = pytest.mark.timeout(300)

SWEEP = """%%parallel x in range(3) --sweep
import jupyter_cluster as jc
jc.report(step=0, topic="ren", loss=1.0 / (x + 1))
x
"""


def _client(kernel_id: str):
    from jupyter_client import BlockingKernelClient
    from jupyter_core.paths import jupyter_runtime_dir

    kc = BlockingKernelClient(connection_file=os.path.join(jupyter_runtime_dir(), f"kernel-{kernel_id}.json"))
    kc.load_connection_file()
    kc.start_channels()
    deadline = time.monotonic() + 120
    while True:  # the server starts the kernel asynchronously: its heartbeat may not answer at first
        try:
            kc.wait_for_ready(timeout=30)
            return kc
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_a_renamed_notebook_keeps_its_jobs_history_and_runs(tmp_path):
    server = JupyterProcess(str(tmp_path), app="server").start(timeout=120)
    kc = None
    h = server.headers

    def api(path, **params):
        r = requests.get(server.api(path), headers=h, params=params, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()

    def jobs_of(nb):
        j = api("jobs", notebook=nb)
        return j["running"] + j["recent"]

    try:
        r = requests.post(
            f"{server.url}api/sessions",
            headers=h,
            json={
                "path": "Untitled.ipynb",
                "name": "Untitled.ipynb",
                "type": "notebook",
                "kernel": {"name": "python3"},
            },
            timeout=60,
        )
        assert r.status_code == 201, r.text
        session, kernel_id = r.json()["id"], r.json()["kernel"]["id"]
        kc = _client(kernel_id)
        kernel_ok(
            kc,
            "%load_ext jupyter_cluster\nimport jupyter_cluster as jc\n"
            "jc.start(name='ren-1', workers=1, threads=1, processes=False)",
            timeout=120,
        )
        kernel_ok(kc, SWEEP)
        wait_for(lambda: jobs_of("Untitled.ipynb"), 30, message="the job under the notebook's first name")

        # the user renames the notebook (JupyterLab changes the session's path, then its name: here the path only)
        r = requests.patch(f"{server.url}api/sessions/{session}", headers=h, json={"path": "sweep.ipynb"}, timeout=60)
        assert r.status_code == 200, r.text
        [job] = wait_for(lambda: jobs_of("sweep.ipynb"), 30, message="the job under the new name")
        assert job["name"].startswith("sweep.ipynb · In [")
        assert jobs_of("Untitled.ipynb") == []

        # the kernel was not told yet: its next map is still the renamed notebook's on the server
        kernel_ok(kc, "jc.map(abs, [-1, -2])")
        wait_for(lambda: len(jobs_of("sweep.ipynb")) == 2, 30, message="the second job under the new name")

        # the front end tells the kernel (a silent execution of this): its runs name the new path
        out = kernel_ok(
            kc,
            "from jupyter_cluster.tracking.renamed import follow_rename\n"
            "print(follow_rename('Untitled.ipynb', 'sweep.ipynb'))\n"
            "print(len(jc.runs(notebook='sweep.ipynb', kept=False)))",
        )
        last = out.strip().splitlines()
        assert last[-2].endswith("sweep.ipynb") and last[-1] == "4", out  # 3 sweep items, 1 map

        # a kernel restart stops its cluster: the kept history is the renamed notebook's, and jc.runs() finds it
        kc.stop_channels()
        kc = None
        r = requests.post(f"{server.url}api/kernels/{kernel_id}/restart", headers=h, timeout=120)
        assert r.status_code == 200, r.text
        wait_for(
            lambda: any(k.get("notebooks") == ["sweep.ipynb"] for k in api("jobs")["history"]),
            60,
            message="the stopped cluster kept under the notebook's new name",
        )
        kc = _client(kernel_id)
        code = "import jupyter_cluster as jc\nprint(json.dumps([len(jc.runs()), sorted(set(jc.runs()['notebook']))]))"
        out = kernel_ok(kc, "import json\n" + code)
        n, notebooks = json.loads(out.strip().splitlines()[-1])
        assert n == 4 and notebooks == ["sweep.ipynb"], out  # 3 sweep items and the map's one run row
        kept = [k for k in api("jobs")["history"] if k.get("notebooks") == ["sweep.ipynb"]]
        assert "sweep.ipynb" in kept[0]["title"] and "Untitled" not in kept[0]["title"]
    finally:
        if kc is not None:
            kc.stop_channels()
        for s in requests.get(f"{server.url}api/sessions", headers=h, timeout=30).json():
            requests.delete(f"{server.url}api/sessions/{s['id']}", headers=h, timeout=60)
        server.stop()


def test_a_rename_after_the_cluster_stopped_rekeys_its_kept_history_on_disk(tmp_path):
    """The kept cluster's jobs, notebooks, title and file name the new path; another notebook's stay."""
    from types import SimpleNamespace

    from jupyter_cluster.server.history import HistoryFolder, KeptCluster
    from jupyter_cluster.server.renames import NotebookRenames, current_notebook, forget_renames
    from jupyter_cluster.tracking.kept import kept_runs

    forget_renames()
    now = time.time()
    jobs = [
        {"job": f"j{i}", "run": f"r{i}", "kind": "map", "label": "f", "total": 1, "done": 1, "failed": 0}
        | {"state": "finished", "cluster": "c", "started": now, "updated": now, "notebook": nb, "kernel_id": kid}
        for i, (nb, kid) in enumerate([("Untitled.ipynb", "k1"), ("Untitled.ipynb", "k1"), ("other.ipynb", "k2")])
    ]
    kept = KeptCluster("c.stopped-010203", {"cluster": "c", "stopped": now}, jobs, [])
    disk = HistoryFolder(str(tmp_path))
    manager = SimpleNamespace(connections={}, history={kept.key: kept}, _disk=disk, _history_version=0)
    disk.save(kept)
    assert set(kept_runs("Untitled.ipynb", folder=str(tmp_path))[0]) == {"r0", "r1"}

    try:
        assert NotebookRenames(manager).renamed("Untitled.ipynb", "work/sweep.ipynb", "k1") == 2
        assert kept.notebooks == ["work/sweep.ipynb", "other.ipynb"]
        assert "sweep.ipynb" in kept.summary()["title"] and "Untitled" not in kept.summary()["title"]
        names = sorted(j["name"] for j in kept.jobs.jobs.values())
        assert names == ["other.ipynb · f", "sweep.ipynb · f", "sweep.ipynb · f"]
        # the restarted kernel (named by the new path) finds them on disk; the old name finds none
        assert set(kept_runs("work/sweep.ipynb", folder=str(tmp_path))[0]) == {"r0", "r1"}
        assert kept_runs("Untitled.ipynb", folder=str(tmp_path))[0] == {}
        assert set(kept_runs("other.ipynb", folder=str(tmp_path))[0]) == {"r2"}
        # later messages: the renamed kernel's follow it; a new Untitled.ipynb's (another kernel) keep their name
        assert current_notebook("Untitled.ipynb", "k1") == "work/sweep.ipynb"
        assert current_notebook("Untitled.ipynb", "k9") == "Untitled.ipynb"
        assert current_notebook("Untitled.ipynb", None) == "work/sweep.ipynb"
    finally:
        forget_renames()
