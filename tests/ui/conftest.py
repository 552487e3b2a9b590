"""Browser fixtures: Debian's Chromium driven by Playwright, JupyterLab on loopback."""

from __future__ import annotations

import os

import pytest

from ..jupyter_process import JupyterProcess

CHROMIUM = os.environ.get("JUPYTER_CLUSTER_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARTIFACTS = os.path.join(ROOT, "test-artifacts")


@pytest.fixture(scope="session")
def chromium_path():
    if not os.path.exists(CHROMIUM):
        if os.environ.get("CI"):
            pytest.fail(f"Chromium is missing at {CHROMIUM}; CI installs it with apt-get install chromium (.ci/run).")
        pytest.skip(f"Chromium is not installed at {CHROMIUM} (apt-get install chromium); browser tests run in CI.")
    return CHROMIUM


@pytest.fixture(scope="module")
def browser(chromium_path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def artifacts():
    os.makedirs(ARTIFACTS, exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab under a non-root base_url (as on JupyterHub), with a token."""
    root = tmp_path_factory.mktemp("lab-root")
    proc = JupyterProcess(str(root), app="lab", base_url="/hub/user/tester/").start(timeout=120)
    yield proc
    proc.stop()
    from ..server.test_server import _stop_panel_clusters

    _stop_panel_clusters()
