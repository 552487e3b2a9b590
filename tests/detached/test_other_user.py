"""Another OS user of the machine gets nothing of our detached work (issue 35).

A real second account (made here with ``useradd``, removed after) runs a
probe and a Jupyter server of its own, through ``setpriv`` as root (as
tests/cluster/test_security.py does for the clusters): it cannot read the
store's files, ``jupyter_cluster.job(NAME)`` in its process does not find our
job (and pointed at our store, is refused in one sentence), and its server
lists neither our jobs nor our kept clusters.  Our own view of the same job is
the control.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest
import requests

import jupyter_cluster as jc

from ..jupyter_process import JupyterProcess

pytestmark = pytest.mark.slow

WORKTREE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROBE = r"""
import json, os, sys
store, job = sys.argv[1], sys.argv[2]
out = {}
for label, path in (("list", store), ("meta", os.path.join(store, job, "meta.json")),
                    ("results", os.path.join(store, job, "results.bin"))):
    try:
        os.listdir(path) if label == "list" else open(path, "rb").read()
        out[label] = "read"
    except OSError as exc:
        out[label] = type(exc).__name__
import dask.config
import jupyter_cluster as jc
from jupyter_cluster.errors import ClusterError
from jupyter_cluster.state import registry

def attempt(label):
    try:
        out[label] = "found: " + repr(jc.job(job))
    except ClusterError as exc:
        out[label] = "ClusterError: " + str(exc)
    except Exception as exc:
        out[label] = "crashed: " + type(exc).__name__ + ": " + str(exc)

attempt("own-store")  # their default store, in their home
out["kept"] = [r.name for r in registry.live_records()]
with dask.config.set({"jupyter-cluster.detached.store-dir": store}):
    attempt("our-store")  # pointed at ours (a shared config, a typo): refused
print("PROBE " + json.dumps(out))
"""


@pytest.fixture
def other_user():
    """``(uid, gid, home)`` of a fresh OS account, deleted after the test."""
    if os.name != "posix" or os.geteuid() != 0:
        pytest.skip("needs root to create and act as a second OS user; run the suite as root, e.g. in CI")
    if not (shutil.which("useradd") and shutil.which("userdel") and shutil.which("setpriv")):
        pytest.skip("needs useradd, userdel and setpriv to act as a second OS user")
    import pwd

    name = f"jcother{os.getpid() % 100000}"
    home = tempfile.mkdtemp(prefix="jc-other-home-")
    made = subprocess.run(
        ["useradd", "--no-create-home", "--home-dir", home, "--shell", "/usr/sbin/nologin", "--user-group", name],
        capture_output=True,
        text=True,
    )
    if made.returncode != 0:
        shutil.rmtree(home, ignore_errors=True)
        pytest.skip(f"useradd could not make a second OS user: {made.stderr.strip()[-200:]}")
    try:
        entry = pwd.getpwnam(name)
        os.chown(home, entry.pw_uid, entry.pw_gid)
        os.chmod(home, 0o700)
        yield entry.pw_uid, entry.pw_gid, home
    finally:
        subprocess.run(["userdel", name], capture_output=True)
        shutil.rmtree(home, ignore_errors=True)


def _probe(user, store: str, job: str) -> dict:
    uid, gid, home = user
    cmd = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", sys.executable, "-c", PROBE, store, job]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home, "PYTHONPATH": WORKTREE}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=home)
    lines = [line for line in out.stdout.splitlines() if line.startswith("PROBE ")]
    if not lines and "Permission denied" in out.stderr and "jupyter_cluster" not in out.stderr:
        pytest.skip(f"the second OS user cannot run {sys.executable} here: {out.stderr.strip()[-200:]}")
    assert lines, out.stdout + out.stderr[-3000:]
    return json.loads(lines[-1][len("PROBE ") :])


def test_another_os_user_cannot_see_or_read_our_detached_jobs(other_user, private_store):
    uid, gid, home = other_user
    handle = jc.start(keep=True, workers=1, threads=1, idle_timeout=120, name="other-k")
    server = None
    try:
        job = jc.submit(pow, range(4), [2] * 4, name="other-job", cluster=handle)
        assert job.result(timeout=60) == [0, 1, 4, 9]  # the control: we see it and its results

        probe = _probe(other_user, private_store, "other-job")
        assert (probe["list"], probe["meta"], probe["results"]) == ("PermissionError",) * 3, probe
        assert probe["own-store"].startswith("ClusterError: no detached job named 'other-job' (known: none)"), probe
        assert probe["our-store"].startswith("ClusterError: the detached jobs' folder"), probe
        assert "is not a folder of this user" in probe["our-store"], probe
        assert probe["kept"] == [], probe

        # their Jupyter server: their own (empty) jobs and clusters, never ours
        server = JupyterProcess(home, user=other_user).start()
        r = requests.get(server.api("detached"), headers=server.headers, timeout=30)
        assert r.status_code == 200, r.text
        assert r.json() == {"jobs": [], "kept": []}
        r = requests.get(server.api("clusters"), headers=server.headers, timeout=30)
        assert r.status_code == 200 and "other-k" not in r.text, r.text
        server.stop()
        # ... and pointed at our store, it says why in one sentence instead of listing (or failing with a 500)
        env = {"DASK_JUPYTER_CLUSTER__DETACHED__STORE_DIR": private_store}
        server = JupyterProcess(home, user=other_user, env=env).start()
        r = requests.get(server.api("detached"), headers=server.headers, timeout=30)
        assert r.status_code == 400 and "is not a folder of this user" in r.json()["message"], r.text
        assert "other-job" not in r.text
    finally:
        if server is not None:
            server.stop()
        for h in jc.cluster.session.handles():
            h.close()
        if jc.cluster.session.registry.read("other-k") is not None:
            jc.stop("other-k")
