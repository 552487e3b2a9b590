"""A JupyterLab page in the test browser, as every browser test opens and closes one."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def shot(page: Any, artifacts: str, name: str, selector: str | None = None) -> str:
    """A screenshot of the page (or of ``selector``) in ``artifacts``; its path."""
    path = os.path.join(artifacts, name)
    if selector:
        page.locator(selector).screenshot(path=path)
    else:
        page.screenshot(path=path, full_page=False)
    return path


# Run All only once the kernel has answered kernel_info: a request sent while
# the kernel is still connecting can be lost.  With a true argument, the
# notebook is then saved.
RUN_ALL_WHEN_READY_JS = """
async (save) => {
  const app = window.jupyterapp;
  const panel = app.shell.currentWidget;
  await panel.sessionContext.ready;
  await panel.sessionContext.session.kernel.info;
  await app.commands.execute('notebook:run-all-cells');
  if (save) {
    await app.commands.execute('docmanager:save');
  }
}
"""


# Run ``code`` in the active notebook's kernel, outside any cell; the promise ends once it has run.
EXECUTE_JS = """
async (code) => {
  const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
  await kernel.requestExecute({ code }).done;
}
"""


@contextmanager
def lab_page(
    browser: Any,
    lab: Any,
    path: str,
    viewport: tuple[int, int] = (1500, 1000),
    artifacts: str | None = None,
    last_shot: str | None = None,
    expected_errors: tuple[str, ...] = (),
) -> Iterator[Any]:
    """A new browser context's page at ``<lab.url><path>`` (logged in with the token).

    When the body ends without an error, the browser console must hold no error
    from our extension but those containing one of ``expected_errors``; at the end, failing or not, the page is shot as
    ``last_shot`` (the state a failure left) and the context closed.
    """
    context = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]})
    watcher = getattr(context, "_jc_page_errors", None)  # tests/ui/conftest.py's page_errors fixture
    if watcher is not None:
        watcher.expect(*expected_errors)
    page = context.new_page()
    console_errors: list[str] = []
    page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
    try:
        page.goto(f"{lab.url}{path}?token={lab.token}", timeout=90_000)
        yield page
        ours = [e for e in console_errors if "jupyter-cluster" in e and not any(x in e for x in expected_errors)]
        assert not ours, ours
    finally:
        if artifacts and last_shot:
            shot(page, artifacts, last_shot)
        context.close()


def open_panel(page: Any, command: str = "jupyter-cluster:open", panel: str = "#jupyter-cluster-panel") -> None:
    """Show the panel through its command, once JupyterLab can keep it shown.

    The command only activates the panel's sidebar tab; run before the app has
    restored its saved layout, the restore can collapse the sidebar again
    afterwards and the panel stays hidden.  So wait for the command to be
    registered and for ``app.restored``, then run the command until the panel
    is attached and visible (a run that JupyterLab undid is run again).
    """
    page.wait_for_function(f"!!window.jupyterapp && window.jupyterapp.commands.hasCommand('{command}')", timeout=60_000)
    page.evaluate("window.jupyterapp.restored")  # a Promise: evaluate waits for it
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    last: Exception | None = None
    for _ in range(5):
        page.evaluate(f"window.jupyterapp.commands.execute('{command}')")
        try:
            page.locator(panel).wait_for(state="visible", timeout=10_000)
            return
        except PlaywrightTimeout as e:
            last = e
    raise AssertionError(f"{panel} stayed hidden after running {command} 5 times") from last


def notebook_ready(page: Any) -> None:
    """Wait until the open notebook shows its cells and its kernel is idle; a kernel picker, if shown, takes the default."""
    page.wait_for_selector(".jp-NotebookPanel .jp-Notebook .jp-Cell", timeout=90_000)
    page.wait_for_selector('.jp-Notebook-ExecutionIndicator[data-status="idle"]', timeout=90_000)
    picker = page.locator(".jp-Dialog .jp-mod-accept")
    if picker.count():  # a kernel picker despite autoStartDefaultKernel: take the default
        picker.click()


def drag_sidebar_to(page: Any, x: float) -> None:
    """Drag the handle between the left sidebar and the main area to ``x``."""
    handle = page.locator("#jp-main-split-panel > .lm-SplitPanel-handle").first
    box = handle.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.down()
    page.mouse.move(x, box["y"] + box["height"] / 2, steps=5)
    page.mouse.up()
