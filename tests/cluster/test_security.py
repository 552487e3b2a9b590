"""Other users of the machine cannot use our clusters (issue 18.2, 18.6, 18.13).

A default local cluster uses TLS with credentials only this user can read, so a
second OS user - here the real ``nobody`` account, reached with ``setpriv`` as
root - is refused, while everything of ours keeps working (see test_tls.py for
the front ends).  A ``--no-tls`` cluster is the control: there ``nobody`` does
get in, which shows the probe can tell the difference.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys

import pytest

import jupyter_cluster as jc
from jupyter_cluster.state import credentials, registry

PROBE = r"""
import json, os, sys
out = {}
address, pem = sys.argv[1], sys.argv[2]
from distributed import Client
from distributed.security import Security

def attempt(label, target, **kw):
    try:
        c = Client(target, timeout=5, set_as_default=False, **kw)
        out[label] = c.run(os.getuid)
        c.close()
    except Exception as exc:
        out[label] = "refused: " + type(exc).__name__

attempt("plain", address)
attempt("tcp", address.replace("tls://", "tcp://"))
if address.startswith("tls://"):
    attempt("own-cert", address, security=Security.temporary())
try:
    with open(pem) as f:
        f.read()
    out["read"] = "read"
except OSError as exc:
    out["read"] = type(exc).__name__
print("PROBE " + json.dumps(out))
"""


def _as_nobody(*args: str, script: str = PROBE) -> dict:
    """Run ``script`` (default PROBE) as the OS user ``nobody``; skip where that is impossible."""
    if os.name != "posix" or os.geteuid() != 0:
        pytest.skip("needs root to run a probe as a second OS user (nobody); run the suite as root, e.g. in CI")
    tool = shutil.which("setpriv")
    if tool is None:
        pytest.skip("needs setpriv (util-linux) to run a probe as the OS user nobody")
    try:
        import pwd

        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("this machine has no 'nobody' user to act as a second OS user")
    cmd = [
        tool,
        f"--reuid={nobody.pw_uid}",
        f"--regid={nobody.pw_gid}",
        "--clear-groups",
        sys.executable,
        "-c",
        script,
        *args,
    ]
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": "/tmp",
        "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    }
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd="/")
    lines = [line for line in out.stdout.splitlines() if line.startswith("PROBE ")]
    if not lines and "Permission denied" in out.stderr:
        pytest.skip(f"the user nobody cannot run {sys.executable} here: {out.stderr.strip()[-200:]}")
    assert lines, out.stdout + out.stderr[-3000:]
    return json.loads(lines[-1][len("PROBE ") :])


def test_default_local_cluster_uses_tls_with_private_credentials():
    handle = jc.start(workers=1, threads=1, name="sec-default")
    try:
        assert handle.address.startswith("tls://127.0.0.1:")
        folder = registry.registry_dir()
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
        for path in (credentials.pem_path(handle.name), credentials.credentials_path(handle.name)):
            st = os.stat(path)
            assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.getuid(), path
        assert handle.client.submit(pow, 2, 5).result() == 32
    finally:
        handle.close()
    # 18.13: the key is gone as soon as the cluster is stopped, not when the process exits.
    assert not os.path.exists(credentials.pem_path("sec-default"))
    assert not os.path.exists(credentials.credentials_path("sec-default"))


def test_another_os_user_is_refused_by_a_default_cluster():
    handle = jc.start(workers=1, threads=1, name="sec-other-user")
    try:
        probe = _as_nobody(handle.address, credentials.pem_path(handle.name))
        assert all(str(probe[k]).startswith("refused") for k in ("plain", "tcp", "own-cert")), probe
        assert probe["read"] == "PermissionError", probe
        assert handle.client.submit(sum, [1, 2]).result() == 3  # and we are not disturbed
    finally:
        handle.close()


def test_no_tls_opt_out_is_plain_tcp_and_open_to_other_users():
    """The control case: with --no-tls the same probe gets in (so the probe can fail)."""
    handle = jc.start(workers=1, threads=1, name="sec-opt-out", tls=False)
    try:
        assert handle.address.startswith("tcp://")
        assert not os.path.exists(credentials.pem_path(handle.name))
        probe = _as_nobody(handle.address, "/nonexistent")
        assert list(probe["plain"].values()) == [os.getuid()], probe
    finally:
        handle.close()


def test_opt_out_through_config_and_magic(ip):
    import dask.config

    with dask.config.set({"jupyter-cluster.local.tls": False}):
        handle = jc.start(workers=1, name="sec-config-off", wait=False)
    try:
        assert handle.address.startswith("tcp://")
    finally:
        handle.close()
    ip.run_line_magic("cluster", "start --workers 1 --name sec-magic-off --no-tls")
    try:
        assert jc.current().address.startswith("tcp://")
    finally:
        ip.run_line_magic("cluster", "stop")


def test_key_generation_is_fast():
    import time

    t0 = time.perf_counter()
    for i in range(20):
        credentials.new_security(f"keygen-{i}")
        credentials.forget_security(f"keygen-{i}")
    assert (time.perf_counter() - t0) / 20 < 0.05  # RSA-2048 (Security.temporary) takes ~0.05-0.1 s each


def test_no_plain_http_port_is_left_open_by_the_workers():
    """Workers' HTTP servers (Prometheus metrics) stop listening, like the scheduler's dashboard."""
    import urllib.request

    import psutil

    from ..conftest import wait_for

    handle = jc.start(workers=2, threads=1, name="sec-http")
    try:
        pids = list(handle.client.run(os.getpid).values())

        def open_http_ports():
            found = []
            for pid in pids:
                for conn in psutil.Process(pid).net_connections(kind="inet"):
                    if conn.status != psutil.CONN_LISTEN:
                        continue
                    try:
                        urllib.request.urlopen(f"http://127.0.0.1:{conn.laddr.port}/metrics", timeout=2).read(1)
                        found.append((pid, conn.laddr.port))
                    except OSError:
                        pass  # the worker's TLS comm port: no plain HTTP there
            return found

        wait_for(lambda: not open_http_ports(), timeout=20, message="the workers' HTTP ports to close")
    finally:
        handle.close()


def test_a_name_whose_credentials_another_start_wrote_is_not_picked():
    """Two processes starting unnamed clusters at once: the second must not reuse (and overwrite) the first's name."""
    from jupyter_cluster.cluster import session

    pending = session._unique_name("local")  # the name an unnamed start would pick now
    credentials.new_security(pending)  # another process, mid-start: credentials written, no record yet
    with open(credentials.pem_path(pending)) as f:
        theirs = f.read()
    try:
        handle = jc.start(workers=1)
        try:
            assert handle.name != pending
            with open(credentials.pem_path(pending)) as f:
                assert f.read() == theirs  # their key and certificate are untouched
        finally:
            handle.close()
    finally:
        credentials.forget_security(pending)


def test_the_fork_server_listens_only_for_this_user():
    """Whoever can connect to the fork server that local workers come from can run code as us."""
    from multiprocessing import forkserver

    handle = jc.start(workers=1)
    try:
        address = forkserver._forkserver._forkserver_address
        assert isinstance(address, str) and address.startswith("/"), f"not a socket file: {address!r}"
        st, folder = os.stat(address), os.stat(os.path.dirname(address))
        assert stat.S_ISSOCK(st.st_mode) and st.st_uid == os.getuid()
        assert stat.S_IMODE(st.st_mode) == 0o600 and stat.S_IMODE(folder.st_mode) == 0o700
    finally:
        handle.close()


STORE_PROBE = r"""
import datetime, json, os, sys, threading
import torch.distributed as dist
out = {}

def attempt(where):
    host, port = where.rsplit(":", 1)
    try:
        store = dist.TCPStore(host, int(port), is_master=False, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=3))
        got = {"keys": store.num_keys()}
        store.set("jc-probe-injected", "from another user")
        got["wrote"] = store.check(["jc-probe-injected"])
        out[where] = got
    except Exception as exc:
        out[where] = "refused: " + type(exc).__name__

# a port that accepts the connection but never answers (TLS, gloo) can block past the store's timeout
threads = [threading.Thread(target=attempt, args=(w,), daemon=True) for w in sys.argv[1].split(",")]
for t in threads:
    t.start()
for t in threads:
    t.join(20)
for where in sys.argv[1].split(","):
    out.setdefault(where, "refused: no answer in 20 s")
print("PROBE " + json.dumps(out), flush=True)
os._exit(0)
"""


@pytest.mark.slow  # ~50 s on a quiet 2-core machine: torch ranks probed by a second OS user
def test_another_os_user_cannot_use_the_spmd_rendezvous(tmp_path):
    """Issue 25.6: while an %%spmd cell runs, nothing the ranks' workers listen on lets the user
    ``nobody`` read the rendezvous keys (the gloo peers' addresses) or write keys the ranks trust, and
    everything they listen on is on the workers' own interface (loopback here), not 0.0.0.0."""
    pytest.importorskip("torch")
    import threading

    import psutil

    from jupyter_cluster.collective import worker as spmd_worker

    from ..conftest import wait_for

    release = tmp_path / "release"

    def cell(rank, world_size, flag=str(release)):
        import os as _os
        import time as _time

        import torch
        import torch.distributed as dist

        deadline = _time.monotonic() + 120
        while not _os.path.exists(flag) and _time.monotonic() < deadline:
            _time.sleep(0.05)  # the probe runs now, with the group initialised
        t = torch.ones(1)
        dist.all_reduce(t)
        return t.item(), _os.environ.get("GLOO_SOCKET_IFNAME")

    handle = jc.start(workers=2, threads=1, name="sec-spmd")
    result: dict = {}
    try:
        handle.wait_for_workers(2, timeout=60)
        host = handle.address.split("://", 1)[1].rsplit(":", 1)[0]
        pids = handle.client.run(os.getpid)

        def go():
            try:
                result["value"] = jc.spmd(cell, cluster=handle, show=None)
            except BaseException as exc:  # noqa: BLE001 - asserted below
                result["error"] = exc

        runner = threading.Thread(target=go, daemon=True)
        runner.start()

        def inside():
            assert runner.is_alive(), result  # the cell must still be running, not failed
            return all(s["running"] and s["initialized"] for s in handle.client.run(spmd_worker.status).values())

        wait_for(inside, timeout=120, message="both ranks inside the cell with the group initialised")
        listening = sorted(
            {
                (c.laddr.ip, c.laddr.port)
                for pid in pids.values()
                for c in psutil.Process(pid).net_connections(kind="inet")
                if c.status == psutil.CONN_LISTEN
            }
        )
        assert listening, "the workers listen on nothing?"
        # every port: the Dask comm (TLS) and gloo's own listener; no store of its own on any interface
        assert {ip for ip, _ in listening} == {host}, listening
        targets = ",".join(f"{'127.0.0.1' if ip in ('0.0.0.0', '::') else ip}:{port}" for ip, port in listening)
        probe = _as_nobody(targets, script=STORE_PROBE)
        assert all(str(v).startswith("refused") for v in probe.values()), probe
        release.write_text("go")
        runner.join(timeout=120)
        # the ranks were not disturbed, and gloo was told to listen on the workers' interface (loopback)
        loopback = next(n for n, addrs in psutil.net_if_addrs().items() if any(a.address == host for a in addrs))
        assert result.get("value") == {0: (2.0, loopback), 1: (2.0, loopback)}, result
    finally:
        release.write_text("go")
        handle.close()
