"""The panel's Detached section in a real JupyterLab (Chromium): a kept cluster marked with who is
attached, its detached jobs with progress and cell, Cancel, and the fetch code copied."""

from __future__ import annotations

import os
import time

import pytest

import jupyter_cluster as jc

from ..jupyter_process import JupyterProcess
from .pages import lab_page, open_panel

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(300)]

STORE_ENV = "DASK_JUPYTER_CLUSTER__DETACHED__STORE_DIR"
SECTION = "#jupyter-cluster-panel .jc-detached"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A private results store, set before the server starts (it reads it as the kernels do)."""
    import dask.config

    path = str(tmp_path_factory.mktemp("detached") / "jobs")
    old = os.environ.get(STORE_ENV)
    os.environ[STORE_ENV] = path
    try:
        with dask.config.set({"jupyter-cluster.detached.store-dir": path}):
            yield path
    finally:
        if old is None:
            os.environ.pop(STORE_ENV, None)
        else:
            os.environ[STORE_ENV] = old


@pytest.fixture(scope="module")
def lab(store, tmp_path_factory):
    """JupyterLab (as conftest's) reading this module's store."""
    root = tmp_path_factory.mktemp("lab-root")
    proc = JupyterProcess(str(root), app="lab", base_url="/hub/user/tester/").start(timeout=120)
    yield proc
    proc.stop()


def nap(x):
    time.sleep(5)
    return x


def test_detached_section_lists_kept_cluster_and_jobs_and_cancels(browser, lab, artifacts):
    handle = None
    try:
        handle = jc.start(keep=True, workers=1, idle_timeout=600, name="ui-kept")
        quick = jc.submit(abs, [-1, -2, -3], name="ui-quick", cluster=handle, notebook="sweeps.ipynb", cell="In[4]")
        assert quick.result(timeout=60) == [1, 2, 3]
        jc.submit(nap, range(30), name="ui-long", cluster=handle)
        with lab_page(browser, lab, "lab", artifacts=artifacts, last_shot="panel-detached.png") as page:
            page.context.grant_permissions(["clipboard-read", "clipboard-write"])
            open_panel(page)
            card = page.locator('#jupyter-cluster-panel .jc-cluster[data-name="ui-kept"]')
            card.wait_for(timeout=30_000)
            page.wait_for_function(
                """() => document.querySelector('.jc-cluster[data-name="ui-kept"] .jc-cluster-badges')
                           ?.textContent.includes('kept')""",
                timeout=30_000,
            )
            group = page.locator(f'{SECTION} .jc-detached-group[data-cluster="ui-kept"]')
            group.wait_for(timeout=30_000)
            assert "kept · 1 kernel attached · 1 job running" in group.locator(".jc-kept").inner_text()
            done = group.locator('.jc-detached-job[data-job="ui-quick"]')
            assert "finished 3/3" in done.inner_text() and "sweeps.ipynb · In[4]" in done.inner_text()
            assert done.locator(".jc-cancel-detached").count() == 0
            done.locator(".jc-copy-fetch").click()
            copied = page.evaluate("navigator.clipboard.readText()")
            assert copied == "import jupyter_cluster as jc\nresults = jc.job('ui-quick').result()"
            running = group.locator('.jc-detached-job[data-job="ui-long"]')
            running.locator(".jc-cancel-detached").click()
            page.wait_for_function(
                """() => document.querySelector('.jc-detached-job[data-job="ui-long"]')
                           ?.textContent.includes('cancelled')""",
                timeout=30_000,
            )
        assert jc.job("ui-long").status == "cancelled"
    finally:
        if handle is not None and not handle.closed:
            handle.close()
        jc.stop("ui-kept")
