"""The JupyterLab extension's build and install, and its TypeScript unit tests (Jest).

``make test`` builds the extension first (jlpm install + build), so these run
on a fresh clone too; they fail, rather than skip, when the build is missing.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)


def _tool(name: str) -> str:
    path = os.path.join(BIN, name)
    if os.path.exists(path):
        return path
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed next to {sys.executable} nor on PATH; run `make setup`.")
    return found


def _run(*cmd: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=BIN + os.pathsep + os.environ.get("PATH", ""), CI="true", FORCE_COLOR="0")
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


def test_typescript_unit_tests_pass():
    if shutil.which("node") is None and not os.environ.get("CI"):
        pytest.skip("Node.js is not installed, so the TypeScript tests cannot run (CI has it).")
    if not os.path.isdir(os.path.join(ROOT, "node_modules", "jest")):
        pytest.fail("node_modules has no jest; run `make setup` (jlpm install) first.")
    result = _run(_tool("jlpm"), "test", "--ci")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "failed" not in output.split("Tests:")[-1].split("\n")[0], output[-2000:]


def test_labextension_is_installed_and_enabled():
    result = _run(_tool("jupyter"), "labextension", "list")
    lines = [line for line in (result.stdout + result.stderr).splitlines() if "jupyter-cluster" in line]
    assert lines, f"jupyter-cluster is not among the lab extensions; run `make setup`.\n{result.stdout}{result.stderr}"
    assert "enabled" in lines[0] and "OK" in lines[0], lines[0]


def test_server_extension_is_enabled_by_the_install():
    result = _run(_tool("jupyter"), "server", "extension", "list")
    text = result.stdout + result.stderr
    lines = [line for line in text.splitlines() if line.strip().startswith("jupyter_cluster")]
    assert lines, f"jupyter_cluster is not a server extension; run `make setup`.\n{text}"
    assert any("enabled" in line for line in lines), text
    assert re.search(r"^\s+jupyter_cluster [\d.]+\s.*OK", text, re.M), text  # validated: imports and loads


def test_prebuilt_extension_ships_the_settings_schema():
    schema = os.path.join(ROOT, "jupyter_cluster", "labextension", "schemas", "jupyter-cluster", "plugin.json")
    assert os.path.exists(schema), "the built extension lacks its settings schema; run `jlpm build`."


def test_the_version_is_written_once_in_package_json():
    """pyproject reads it through hatch-nodejs-version; the package and the built extension report it."""
    import json
    from importlib.metadata import version

    import jupyter_cluster

    with open(os.path.join(ROOT, "package.json")) as f:
        declared = json.load(f)["version"]
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        assert '\nversion = "' not in f.read()  # not written a second time
    assert version("jupyter-cluster") == jupyter_cluster.__version__ == declared
    built = os.path.join(ROOT, "jupyter_cluster", "labextension", "package.json")
    if os.path.exists(built):
        with open(built) as f:
            assert json.load(f)["version"] == declared
