"""A real multi-host cluster on one machine: three network namespaces.

Namespace ``S`` holds a bridge and the Dask scheduler; namespaces ``A`` and
``B`` each hold one ``dask worker`` and a veth into that bridge.  Addresses
are private (10.123.0.0/24) and exist only inside these namespaces: nothing
is routed to or from the machine's own network.  The driver — a real IPython
shell with ``%load_ext jupyter_cluster`` — runs in ``S`` as well (network
namespaces are per process, so it is a subprocess), attaches with
``%cluster connect``, maps a ``%%parallel`` cell that reports metrics, and
while the map runs the test kills every process of host ``B``.  Every result
must still arrive, in order, exactly once.

Needs root (creating namespaces).  Skipped elsewhere with a reason — except
in CI (``CI=true``), where not being able to run it is a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest

from tests.hpc import netns

pytestmark = [pytest.mark.netns, pytest.mark.slow]

SUBNET = "10.123.0"
SCHEDULER_IP = f"{SUBNET}.1"
WORKER_IPS = {"A": f"{SUBNET}.2", "B": f"{SUBNET}.3"}
PORT = 8786
ITEMS = 24


def _unavailable(reason: str):
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"the multi-host test must run in CI but cannot: {reason}")
    pytest.skip(f"multi-host test needs network namespaces: {reason}")


def _sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(args, capture_output=True, text=True, timeout=30)
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {out.stderr.strip()}")
    return out


def _ensure_iproute2() -> str | None:
    ip = shutil.which("ip")
    if ip is None and os.geteuid() == 0 and shutil.which("apt-get") and os.environ.get("CI", "").lower() == "true":
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, timeout=300)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "iproute2"],
            capture_output=True,
            timeout=300,
            env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"),
        )
        ip = shutil.which("ip")
    return ip


class Hosts:
    """Three namespaces, a bridge, and the processes started in them."""

    def __init__(self):
        tag = f"jc{os.getpid() % 100000}{uuid.uuid4().hex[:4]}"
        self.ns = {role: f"{tag}-{role}" for role in ("S", "A", "B")}
        self.procs: list[subprocess.Popen] = []
        self.created: list[str] = []

    def build(self) -> None:
        S = self.ns["S"]
        for name in self.ns.values():
            _sh("ip", "netns", "add", name)
            self.created.append(name)
            _sh("ip", "-n", name, "link", "set", "lo", "up")
        _sh("ip", "-n", S, "link", "add", "br0", "type", "bridge")
        _sh("ip", "-n", S, "addr", "add", f"{SCHEDULER_IP}/24", "dev", "br0")
        _sh("ip", "-n", S, "link", "set", "br0", "up")
        for role in ("A", "B"):
            port = f"to{role}"
            # Both ends are created directly inside their namespaces: the
            # machine's own namespace never sees them.
            _sh("ip", "-n", S, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", self.ns[role])
            _sh("ip", "-n", S, "link", "set", port, "master", "br0")
            _sh("ip", "-n", S, "link", "set", port, "up")
            _sh("ip", "-n", self.ns[role], "addr", "add", f"{WORKER_IPS[role]}/24", "dev", "eth0")
            _sh("ip", "-n", self.ns[role], "link", "set", "eth0", "up")

    def run(self, role: str, *argv: str, **kwargs) -> subprocess.Popen:
        proc = subprocess.Popen(["ip", "netns", "exec", self.ns[role], *argv], **kwargs)
        self.procs.append(proc)
        return proc

    def pids(self, role: str) -> list[int]:
        return netns.pids(self.ns[role])

    def kill_host(self, role: str) -> list[int]:
        """SIGKILL every process in the namespace (they are all ours: the namespace is)."""
        return netns.kill_all(self.ns[role])

    def teardown(self) -> None:
        netns.remove(self.created, self.procs)


@pytest.fixture
def hosts():
    if not sys.platform.startswith("linux"):
        _unavailable("network namespaces are Linux-only")
    if os.geteuid() != 0:
        _unavailable("run as root (creating network namespaces needs CAP_SYS_ADMIN)")
    if _ensure_iproute2() is None:
        _unavailable("the `ip` command (iproute2) is not installed")
    h = Hosts()
    try:
        try:
            h.build()
        except RuntimeError as exc:
            _unavailable(str(exc))
        yield h
    finally:
        h.teardown()
        leftover = set(_sh("ip", "netns", "list", check=False).stdout.split()) & set(h.ns.values())
        assert not leftover, f"namespaces left behind: {leftover}"


def _wait(predicate, timeout: float, what: str, procs=()):
    deadline = time.monotonic() + timeout
    while not predicate():
        for p in procs:
            if p.poll() is not None:
                pytest.fail(f"{what}: a process exited early with code {p.returncode}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


DRIVER = textwrap.dedent(
    """
    import json, sys, warnings
    warnings.simplefilter("error", UserWarning)  # e.g. a version-mismatch warning must not pass silently
    from IPython.testing.globalipapp import start_ipython

    address, markers, items = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ip = start_ipython()
    ip.run_line_magic("load_ext", "jupyter_cluster")
    ip.run_line_magic("cluster", "connect " + address)
    import jupyter_cluster as jc
    jc.cluster.session.current().wait_for_workers(2, timeout=90)
    ip.user_ns["MARKERS"] = markers
    print("READY", flush=True)
    ip.run_cell_magic("parallel", "i in range(%d) --out results --no-progress" % items, '''
    import os, time
    from distributed import get_worker
    import jupyter_cluster as jc
    host = get_worker().address.split("//")[1].split(":")[0]
    open(os.path.join(MARKERS, "%d-%s" % (i, host)), "w").close()
    time.sleep(0.25)
    jc.report(step=i, topic="netns", value=float(i * i))
    (i, i * i, host)
    ''')
    rows = jc.metrics("netns")
    rows = rows.to_dict("records") if hasattr(rows, "to_dict") else rows
    print("RESULT " + json.dumps({
        "results": ip.user_ns["results"],
        "metric_steps": sorted({int(r["step"]) for r in rows}),
        "metric_values": {int(r["step"]): r["value"] for r in rows},
        "address": jc.cluster.session.current().address,
    }), flush=True)
    """
)


def test_parallel_cell_survives_losing_a_host(hosts, tmp_path):
    python = sys.executable
    env = dict(os.environ, PYTHONUNBUFFERED="1", DASK_DISTRIBUTED__WORKER__DAEMON="True")
    logs = {}

    def start(role, name, *argv):
        logs[name] = open(tmp_path / f"{name}.log", "w")
        return hosts.run(role, python, *argv, stdout=logs[name], stderr=subprocess.STDOUT, env=env)

    address = f"tcp://{SCHEDULER_IP}:{PORT}"
    t0 = time.monotonic()
    scheduler = start(
        "S",
        "scheduler",
        "-m",
        "distributed.cli.dask_scheduler",
        "--host",
        SCHEDULER_IP,
        "--port",
        str(PORT),
        "--no-dashboard",
    )
    workers = [
        start(
            role,
            f"worker-{role}",
            "-m",
            "distributed.cli.dask_worker",
            address,
            "--host",
            WORKER_IPS[role],
            "--nthreads",
            "1",
            "--nworkers",
            "1",
            "--no-dashboard",
            "--name",
            f"host-{role}",
            "--death-timeout",
            "120",
        )
        for role in ("A", "B")
    ]
    try:
        markers = tmp_path / "markers"
        markers.mkdir()
        (tmp_path / "driver.py").write_text(DRIVER)
        driver = hosts.run(
            "S",
            python,
            str(tmp_path / "driver.py"),
            address,
            str(markers),
            str(ITEMS),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        # The kill happens from this thread while the driver's map runs.
        killed: dict = {}

        def killer():
            def b_started():
                # B has finished a couple of items and the map is far from done.
                names = os.listdir(markers)
                return sum(n.endswith(WORKER_IPS["B"]) for n in names) >= 3 and len(names) < ITEMS - 4

            deadline = time.monotonic() + 150
            while time.monotonic() < deadline and driver.poll() is None:
                if b_started():
                    killed["done_before"] = len(os.listdir(markers))
                    killed["pids"] = hosts.kill_host("B")
                    return
                time.sleep(0.02)

        thread = threading.Thread(target=killer, daemon=True)
        thread.start()
        try:
            stdout, stderr = driver.communicate(timeout=170)
        except subprocess.TimeoutExpired:
            driver.kill()
            stdout, stderr = driver.communicate()
            pytest.fail(f"the driver did not finish:\n{stdout[-3000:]}\n{stderr[-3000:]}")
        thread.join(5)
    finally:
        for f in logs.values():
            f.close()
    elapsed = time.monotonic() - t0
    line = next((ln for ln in stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert driver.returncode == 0 and line, f"driver failed:\n{stdout[-3000:]}\n{stderr[-5000:]}"
    out = json.loads(line[len("RESULT ") :])

    # The kill really happened mid-map, to processes of host B only.
    assert killed.get("pids"), "host B never started an item, so nothing was killed"
    assert 0 < killed["done_before"] < ITEMS
    assert all(p.poll() is not None for p in workers[1:]), "host B's worker survived the kill"
    assert workers[0].poll() is None and scheduler.poll() is None

    # Every result, in input order, exactly once; the ones finished after the
    # kill came from host A.
    assert [r[:2] for r in out["results"]] == [[i, i * i] for i in range(ITEMS)]
    hosts_used = {r[2] for r in out["results"]}
    assert hosts_used <= set(WORKER_IPS.values()) and WORKER_IPS["A"] in hosts_used
    started_on_b = {int(n.split("-")[0]) for n in os.listdir(markers) if n.endswith(WORKER_IPS["B"])}
    assert started_on_b, "no item ever started on host B"

    # Metrics reported from both hosts reached the notebook.
    assert out["metric_steps"] == list(range(ITEMS))
    assert all(float(v) == float(int(s) ** 2) for s, v in out["metric_values"].items())
    assert out["address"] == f"tcp://{SCHEDULER_IP}:{PORT}"
    assert elapsed < 170
    by_host = {h: sum(1 for r in out["results"] if r[2] == h) for h in sorted(hosts_used)}
    print(
        f"multi-host: {ITEMS} items, results by host {by_host}, host B killed after {killed['done_before']} "
        f"items had started ({len(killed['pids'])} processes), {elapsed:.1f} s in all"
    )
