"""A real ``dask-gateway-server`` for the tests: its local backend, simple (password) auth, on loopback.

The server runs as a subprocess with a generated config file; its clusters'
schedulers and workers are processes of this machine (``UnsafeLocalBackend``:
no user switching, as the test runs as one user).  Schedulers are reached
through the gateway's own proxy (``gateway://``, TLS with per-cluster
certificates made by the gateway).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

PASSWORD = "gateway-test-password"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GatewayServer:
    """``start()`` it; ``address`` is its HTTP API, ``dask_config()`` logs into it."""

    def __init__(self, workdir: Path):
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.address = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 120) -> None:
        python = sys.executable
        config = self.dir / "dask_gateway_config.py"
        config.write_text(
            "\n".join(
                [
                    # the public address (HTTP API and the schedulers' gateway:// TLS); the API server behind it
                    f"c.Proxy.address = '127.0.0.1:{self.port}'",
                    f"c.DaskGateway.address = '127.0.0.1:{free_port()}'",
                    "c.DaskGateway.backend_class = 'dask_gateway_server.backends.local.UnsafeLocalBackend'",
                    "c.DaskGateway.authenticator_class = 'dask_gateway_server.auth.SimpleAuthenticator'",
                    f"c.SimpleAuthenticator.password = {PASSWORD!r}",
                    f"c.UnsafeLocalBackend.clusters_directory = {str(self.dir / 'clusters')!r}",
                    f"c.ClusterConfig.scheduler_cmd = [{python!r}, '-m', 'distributed.cli.dask_scheduler']",
                    f"c.ClusterConfig.worker_cmd = [{python!r}, '-m', 'distributed.cli.dask_worker']",
                    "c.ClusterConfig.worker_cores = 1",
                    "c.ClusterConfig.worker_threads = 1",
                    "c.ClusterConfig.worker_memory = 0.5",
                    "c.ClusterConfig.scheduler_memory = 0.5",
                    "c.ClusterConfig.idle_timeout = 600",
                    "c.UnsafeLocalBackend.cluster_heartbeat_period = 5",
                    "c.UnsafeLocalBackend.cluster_start_timeout = 120",
                    "c.UnsafeLocalBackend.worker_start_timeout = 120",
                    "c.DaskGateway.log_level = 'WARN'",
                    "",
                ]
            )
        )
        log = open(self.dir / "gateway.log", "ab")
        self.proc = subprocess.Popen(
            [python, "-m", "dask_gateway_server", "-f", str(config)],
            cwd=self.dir,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # stop() signals the server and every process it started
        )
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dask-gateway-server exited: {self.log_tail()}")
            try:
                urllib.request.urlopen(f"{self.address}/api/health", timeout=2).read()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def log_tail(self) -> str:
        try:
            return (self.dir / "gateway.log").read_text()[-2000:]
        except OSError:
            return ""

    def dask_config(self, password: str = PASSWORD, user: str = "alice") -> dict:
        return {
            "gateway.address": self.address,
            "gateway.auth.type": "basic",
            "gateway.auth.kwargs": {"username": user, "password": password},
        }

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # the gateway stops its clusters on SIGTERM
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # whatever of its group is left
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)


@contextlib.contextmanager
def running_gateway(workdir: Path) -> Iterator[GatewayServer]:
    """A started :class:`GatewayServer` whose login is in dask.config meanwhile; stopped after.

    Skips the test where dask-gateway or dask-gateway-server is not installed.
    """
    import pytest

    try:
        import dask_gateway  # noqa: F401  (its config defaults must be in place before dask.config.set)
        import dask_gateway_server  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"dask-gateway and dask-gateway-server are not installed ({exc}); pip install -e '.[test]'")
    import dask

    server = GatewayServer(workdir)
    try:
        server.start()
        with dask.config.set(server.dask_config()):
            yield server
    finally:
        server.stop()
