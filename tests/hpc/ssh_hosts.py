"""SSH hosts for the tests: real ``sshd`` daemons in network namespaces on one machine.

One namespace holds a bridge (the "switch"); each host is a namespace with a
veth into it and its own address in a private /24 (10.77.X.0/24, X picked per
run); this process's namespace gets one veth into the switch too, so the test
(the notebook) reaches every host and the hosts reach each other, with no
forwarding or routing set up on the machine.  Each host runs
``/usr/sbin/sshd -D`` with a test host key, key-only login for this user, and
a generated client key; a ``known_hosts`` file lists the hosts.  All processes
started in a host's namespace are that host's: killing them is pulling the
host's plug.

Needs root (namespaces, sshd) and the ``openssh-server`` package
(``.ci/run`` installs it when root).
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

from tests.hpc import netns

SSHD = "/usr/sbin/sshd"


def unavailable_reason() -> str | None:
    """Why SSH hosts cannot be made here, or None."""
    if not os.uname().sysname == "Linux":
        return "network namespaces are Linux-only"
    if os.geteuid() != 0:
        return "run as root (network namespaces and sshd need it)"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    if not os.path.exists(SSHD):
        return "sshd is not installed (apt-get install openssh-server)"
    if shutil.which("ssh-keygen") is None:
        return "ssh-keygen is not installed (openssh-client)"
    return None


def _sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(args, capture_output=True, text=True, timeout=60)
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {out.stderr.strip()}")
    return out


def _keygen(path: Path) -> str:
    for old in (path, path.with_suffix(".pub")):
        old.unlink(missing_ok=True)
    _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "jupyter-cluster-test", "-f", str(path))
    return path.with_suffix(".pub").read_text().strip()


class SSHHosts:
    """``n`` sshd hosts behind one switch; ``addresses`` are theirs, in order."""

    def __init__(self, workdir: Path, n: int = 3):
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        tag = f"jh{os.getpid() % 10000}{uuid.uuid4().hex[:3]}"  # interface names: 15 characters at most
        self.tag = tag
        self.switch = f"{tag}-sw"
        self.namespaces = [f"{tag}-h{i}" for i in range(n)]
        self.root_link = f"{tag}r"
        used = _sh("ip", "-4", "-o", "addr", check=False).stdout
        octets = [x for x in range(2, 250) if f"10.77.{x}." not in used]
        self.subnet = f"10.77.{random.choice(octets)}"
        self.addresses = [f"{self.subnet}.{10 + i}" for i in range(n)]
        self.local_address = f"{self.subnet}.1"
        self.created: list[str] = []
        self.sshd: dict[str, subprocess.Popen] = {}
        self.client_key = self.dir / "id_ed25519"
        self.wrong_key = self.dir / "wrong_ed25519"
        self.known_hosts = self.dir / "known_hosts"

    # -- set up ----------------------------------------------------------------------------
    def build(self) -> None:
        for ns in (self.switch, *self.namespaces):
            _sh("ip", "netns", "add", ns)
            self.created.append(ns)
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
        sw = self.switch
        _sh("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
        _sh("ip", "-n", sw, "link", "set", "br0", "up")
        # this process's end: one veth whose peer is created inside the switch namespace
        _sh("ip", "link", "add", self.root_link, "type", "veth", "peer", "name", "up0", "netns", sw)
        _sh("ip", "-n", sw, "link", "set", "up0", "master", "br0")
        _sh("ip", "-n", sw, "link", "set", "up0", "up")
        _sh("ip", "addr", "add", f"{self.local_address}/24", "dev", self.root_link)
        _sh("ip", "link", "set", self.root_link, "up")
        for i, ns in enumerate(self.namespaces):
            port = f"p{i}"
            _sh("ip", "-n", sw, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _sh("ip", "-n", sw, "link", "set", port, "master", "br0")
            _sh("ip", "-n", sw, "link", "set", port, "up")
            _sh("ip", "-n", ns, "addr", "add", f"{self.addresses[i]}/24", "dev", "eth0")
            _sh("ip", "-n", ns, "link", "set", "eth0", "up")
        host_pub = _keygen(self.dir / "host_ed25519")
        client_pub = _keygen(self.client_key)
        _keygen(self.wrong_key)
        (self.dir / "authorized_keys").write_text(client_pub + "\n")
        os.chmod(self.dir / "authorized_keys", 0o600)
        self.known_hosts.write_text("".join(f"{a} {host_pub}\n" for a in self.addresses))
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation folder
        for i in range(len(self.namespaces)):
            self.start_sshd(i)
        for address in self.addresses:
            self.wait_for_port(address, 22)

    def start_sshd(self, i: int) -> None:
        ns, address = self.namespaces[i], self.addresses[i]
        config = self.dir / f"sshd-{i}.conf"
        config.write_text(
            "\n".join(
                [
                    f"ListenAddress {address}",
                    "Port 22",
                    f"HostKey {self.dir / 'host_ed25519'}",
                    f"PidFile {self.dir / f'sshd-{i}.pid'}",
                    f"AuthorizedKeysFile {self.dir / 'authorized_keys'}",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "PermitRootLogin prohibit-password",
                    "UsePAM no",
                    "StrictModes no",
                    "UseDNS no",
                    "MaxStartups 100",
                    "MaxSessions 100",
                    "LogLevel ERROR",
                    "",
                ]
            )
        )
        log = open(self.dir / f"sshd-{i}.log", "ab")
        self.sshd[ns] = subprocess.Popen(
            ["ip", "netns", "exec", ns, SSHD, "-D", "-e", "-f", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()

    @staticmethod
    def wait_for_port(address: str, port: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection((address, port), timeout=2).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def dask_config(self, key: Path | None = None) -> dict:
        """The ``jupyter-cluster.ssh`` settings that log into these hosts (with ``key``, another key)."""
        return {
            "jupyter-cluster.ssh.username": "root",
            "jupyter-cluster.ssh.client-keys": [str(key or self.client_key)],
            "jupyter-cluster.ssh.known-hosts": str(self.known_hosts),
        }

    # -- looking and pulling plugs -------------------------------------------------------------
    def pids(self, i: int) -> list[int]:
        return netns.pids(self.namespaces[i])

    def extra_pids(self, i: int) -> list[int]:
        """Processes on host ``i`` besides its listening sshd (sessions, Dask processes)."""
        daemon = self.sshd.get(self.namespaces[i])
        keep = {daemon.pid} if daemon is not None and daemon.poll() is None else set()
        return [p for p in self.pids(i) if p not in keep]

    def commands(self, i: int) -> list[str]:
        found = []
        for pid in self.extra_pids(i):
            try:
                found.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200])
            except OSError:
                pass
        return found

    def kill_host(self, i: int) -> list[int]:
        """SIGKILL every process of host ``i`` (its sshd too): the host is gone."""
        return netns.kill_all(self.namespaces[i])

    def teardown(self) -> None:
        netns.remove(self.created, self.sshd.values())
        _sh("ip", "link", "del", self.root_link, check=False)  # gone with its peer already, normally
