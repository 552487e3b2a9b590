"""The panel's dashboard link in a real browser, under JupyterLab with a non-root base_url (issue 15.6).

The link goes through the Jupyter server (``<base_url>jupyter-cluster/dashboard/NAME/status``),
works with the browser's Jupyter login cookie and with nothing else.
"""

from __future__ import annotations

import pytest

import jupyter_cluster as jc

from .pages import lab_page, open_panel


@pytest.fixture
def kernel_cluster():
    handle = jc.start(workers=1, threads=1, name="ui-dash")
    yield handle
    if not handle.closed:
        handle.close()


def test_dashboard_link_opens_through_jupyter_under_base_url(lab, browser, kernel_cluster):
    with lab_page(browser, lab, "lab", (1400, 900)) as page:
        context = page.context
        page.wait_for_selector("#jp-main-dock-panel", timeout=90_000)
        open_panel(page)
        row = page.locator('#jupyter-cluster-panel .jc-cluster[data-name="ui-dash"]')
        row.wait_for(timeout=60_000)
        link = row.locator("a.jc-dashboard")
        href = link.get_attribute("href")
        assert href == "/hub/user/tester/jupyter-cluster/dashboard/ui-dash/status"
        # Following it in the same browser (Jupyter's login cookie, no token in the URL) shows the dashboard.
        # It is Dask's Bokeh dashboard (not its "needs bokeh" page): Bokeh's websocket opens through the
        # proxy, its messages arrive, and the plots draw.
        dash = context.new_page()
        frames: list = []
        sockets: list = []

        def on_ws(ws):
            sockets.append(ws.url)
            ws.on("framereceived", lambda payload: frames.append(payload))

        dash.on("websocket", on_ws)
        response = dash.goto(f"http://127.0.0.1:{lab.port}{href}", timeout=60_000)
        assert response.status == 200
        assert "needs bokeh" not in dash.content()
        dash.locator("canvas").first.wait_for(timeout=30_000)  # Playwright's CSS goes into Bokeh's shadow roots
        deadline = 30
        # /status draws several plots (memory, task stream, progress, processing), each on its own canvas
        while (not frames or dash.locator("canvas").count() < 4) and deadline > 0:
            dash.wait_for_timeout(500)
            deadline -= 0.5
        assert sockets and sockets[0].startswith(f"ws://127.0.0.1:{lab.port}{href}/ws"), sockets
        assert frames, "no Bokeh websocket message came through the proxy"
        assert dash.locator("canvas").count() >= 4
        dash.close()
        # A browser without the login gets Jupyter's login page, not the dashboard.
        stranger = browser.new_context()
        try:
            other = stranger.new_page()
            other.goto(f"http://127.0.0.1:{lab.port}{href}", timeout=60_000)
            assert "/hub/user/tester/login" in other.url
        finally:
            stranger.close()
