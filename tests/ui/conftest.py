"""Browser fixtures: Debian's Chromium driven by Playwright, JupyterLab on loopback."""

from __future__ import annotations

import os
from typing import Any

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


# -- page errors: every browser test fails on an uncaught error, or a console error of ours ---------
#: Uncaught errors and console errors that are neither ours nor harmful, each with why it is let pass:
#: an error passes when its text (message and stack) holds every fragment of one key; anything else
#: fails the test.
HARMLESS_PAGE_ERRORS: dict[tuple[str, ...], str] = {
    ("ResizeObserver loop",): (
        "Chromium reports a ResizeObserver whose callback changed layout as an error event: a layout "
        "notice, not an exception (JupyterLab's Lumino panels and ECharts both observe sizes)"
    ),
    ("reading 'schema'", "/static/notebook/notebook_core."): (
        "Notebook 7.x's notebook page raises it while loading its settings, with jupyter-cluster disabled "
        "too (checked with page_config's disabledExtensions); nothing of ours runs in it"
    ),
    ("Command 'filebrowser:open-path' not registered", "/static/notebook/notebook_core."): (
        "Notebook 7.x's notebook page restores JupyterLab's file browser state (filebrowser-extension's "
        "restoreBrowser) although that page registers no file browser; nothing of ours runs in it"
    ),
}


def _ours(text: str, url: str) -> bool:
    """Whether a console error comes from our extension: its script, its API, or its own words."""
    return any(part in f"{text} {url}" for part in ("jupyter-cluster", "jupyter_cluster", "jc-"))


class PageErrors:
    """What the pages of one test raised: uncaught errors (``pageerror``) and console errors of ours."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.expected: list[str] = []
        self._watched: set[int] = set()

    def watch(self, context: Any) -> None:
        """Collect from every page of ``context`` (a Playwright browser context)."""
        if id(context) in self._watched:
            return
        self._watched.add(id(context))
        context._jc_page_errors = self  # lab_page adds the errors its test expects
        context.on("weberror", self._on_error)
        context.on("console", self._on_console)

    def expect(self, *fragments: str) -> None:
        """Errors containing one of ``fragments`` are expected by the test (a server restart, say)."""
        self.expected.extend(fragments)

    def _on_error(self, web_error: Any) -> None:
        error = web_error.error
        self.errors.append(f"uncaught {error.name}: {error.message}\n{error.stack or ''}".rstrip())

    def _on_console(self, message: Any) -> None:
        if message.type != "error":
            return
        url = (message.location or {}).get("url", "")
        if _ours(message.text, url):
            self.errors.append(f"console error: {message.text} ({url})")

    def unexpected(self) -> list[str]:
        allowed = [*HARMLESS_PAGE_ERRORS, *((fragment,) for fragment in self.expected)]
        return [e for e in self.errors if not any(all(f in e for f in fragments) for fragments in allowed)]


@pytest.fixture(autouse=True)
def page_errors(request, monkeypatch):
    """Fail a browser test whose pages raised an uncaught error or logged a console error of ours.

    Every context (and page) the test opens from the ``browser`` fixture is
    watched; at teardown what was seen, less :data:`HARMLESS_PAGE_ERRORS` and
    what the test expects (:meth:`PageErrors.expect`), must be nothing.
    """
    if "browser" not in request.fixturenames:
        yield None
        return
    browser = request.getfixturevalue("browser")
    errors = PageErrors()
    new_context, new_page = browser.new_context, browser.new_page

    def watched_context(*args: Any, **kwargs: Any) -> Any:
        context = new_context(*args, **kwargs)
        errors.watch(context)
        return context

    def watched_page(*args: Any, **kwargs: Any) -> Any:
        page = new_page(*args, **kwargs)
        errors.watch(page.context)
        return page

    monkeypatch.setattr(browser, "new_context", watched_context)
    monkeypatch.setattr(browser, "new_page", watched_page)
    yield errors
    unexpected = errors.unexpected()
    assert not unexpected, "the page raised errors:\n" + "\n".join(unexpected)
