"""Start a real Jupyter server (or JupyterLab) on a free loopback port, with a token.

Used by tests/server/test_server.py and tests/ui/.  The process inherits the test
session's ``JUPYTER_RUNTIME_DIR`` (see conftest.py), so it sees the same
private cluster registry as the tests.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time

import requests


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class JupyterProcess:
    """``jupyter server`` or ``jupyter lab`` as a subprocess.

    Parameters
    ----------
    root_dir : str
        The server's notebook directory.
    app : str
        ``"server"`` or ``"lab"``.
    base_url : str
        A non-root base URL, as on JupyterHub.
    """

    def __init__(
        self,
        root_dir: str,
        app: str = "server",
        base_url: str = "/jc/",
        log_path: str | None = None,
        user: tuple[int, int, str] | None = None,
        env: dict[str, str | None] | None = None,
    ):
        #: ``(uid, gid, home)``: run the server as that OS user (as root, through setpriv), with that HOME
        self.user = user
        #: environment changes (None: the variable is removed)
        self.env = env or {}
        self.root_dir = root_dir
        self.app = app
        self.base_url = base_url
        self.token = secrets.token_hex(16)
        self.port = free_port()
        self.log_path = log_path or os.path.join(root_dir, f"jupyter-{app}.log")
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.base_url}"

    def api(self, path: str) -> str:
        return f"{self.url}jupyter-cluster/api/{path}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}"}

    def start(self, timeout: float = 90) -> JupyterProcess:
        module = "jupyterlab" if self.app == "lab" else "jupyter_server"
        cmd = [
            sys.executable,
            "-m",
            module,
            "--no-browser",
            "--ServerApp.port_retries=0",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.token={self.token}",
            f"--ServerApp.base_url={self.base_url}",
            f"--ServerApp.root_dir={self.root_dir}",
            "--ServerApp.jpserver_extensions={'jupyter_cluster': True}",
        ]
        if self.app == "lab":
            # window.jupyterapp, as JupyterLab's own UI tests (Galata) use it
            cmd += ["--LabApp.expose_app_in_browser=True", "--JupyterNotebookApp.expose_app_in_browser=True"]
        if hasattr(os, "geteuid") and os.geteuid() == 0 and self.user is None:
            cmd.append("--allow-root")
        env = dict(os.environ)
        if self.user is not None:
            uid, gid, home = self.user
            cmd = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", *cmd]
            # their own Jupyter folders, not this session's (conftest points JUPYTER_RUNTIME_DIR at ours)
            env = {k: v for k, v in env.items() if not k.startswith(("JUPYTER_", "DASK_JUPYTER_CLUSTER"))}
            env["HOME"] = home
        for key, value in self.env.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        # No user config: only what the package installs (and the line above) applies.
        env["JUPYTER_CONFIG_DIR"] = os.path.join(self.root_dir, ".jupyter-config")
        env.setdefault("JUPYTERLAB_SETTINGS_DIR", os.path.join(self.root_dir, ".lab-settings"))
        env.setdefault("JUPYTERLAB_WORKSPACES_DIR", os.path.join(self.root_dir, ".lab-workspaces"))
        if self.app == "lab":
            self._quiet_lab_settings(env["JUPYTERLAB_SETTINGS_DIR"])
        deadline = time.monotonic() + timeout
        # The free port is chosen before the server binds it: on a busy machine (xdist workers,
        # Dask workers' ephemeral ports) another process can take it in between.  The server then
        # exits at once saying so; try again on a new port, a few times.
        for _attempt in range(5):
            self._log = open(self.log_path, "wb")
            self.proc = subprocess.Popen(
                [*cmd, f"--ServerApp.port={self.port}"],
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.root_dir,
            )
            if self._wait_for_answer(deadline):
                return self
            self._log.close()
            self.port = free_port()
        raise RuntimeError(f"jupyter {self.app} found no free port in 5 tries:\n{self.log_tail()}")

    def _wait_for_answer(self, deadline: float) -> bool:
        """True once the server answers; False if it exited because its port was taken."""
        assert self.proc is not None
        while True:
            if self.proc.poll() is not None:
                if "because port" in self.log_tail():  # "could not be started because port N is not available"
                    return False
                raise RuntimeError(f"jupyter {self.app} exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                r = requests.get(f"{self.url}api/status", headers=self.headers, timeout=2)
                if r.status_code == 200:
                    return True
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"jupyter {self.app} did not answer in time:\n{self.log_tail()}")
            time.sleep(0.2)

    @staticmethod
    def _quiet_lab_settings(settings_dir: str) -> None:
        """No news toast, no kernel picker: what a scripted browser cannot answer."""
        import json

        for plugin, values in {
            "apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
            "notebook-extension/tracker": {"autoStartDefaultKernel": True},
        }.items():
            path = os.path.join(settings_dir, "@jupyterlab", plugin + ".jupyterlab-settings")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                json.dump(values, f)

    def log_tail(self, n: int = 40) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if getattr(self, "_log", None):
            self._log.close()
