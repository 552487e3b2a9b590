"""The Dask dashboard of a local cluster: closed to other users, served through the Jupyter server.

Issue 18.2 (the dashboard must not be open to other users) and issue 15.6
(dashboard links go through the Jupyter server, under a non-root base_url).
A real ``jupyter server`` with base_url ``/jc/`` and token auth; real clusters.
"""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import subprocess
import sys

import pytest
import requests

import jupyter_cluster as jc
from jupyter_cluster.state import registry

from ..conftest import wait_for
from ..jupyter_process import JupyterProcess

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc = JupyterProcess(str(tmp_path_factory.mktemp("dash-root")), app="server", base_url="/jc/").start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def dash_cluster():
    handle = jc.start(workers=1, threads=1, name="dash-t")
    yield handle
    if not handle.closed:
        handle.close()


def _proxy_url(server, name: str, path: str = "status") -> str:
    return f"http://127.0.0.1:{server.port}/jc/jupyter-cluster/dashboard/{name}/{path}"


def _raw_get(sock_path: str, path: str) -> bytes:
    """GET ``path`` from the dashboard's Unix socket directly (HTTP/1.0)."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(sock_path)
        s.sendall(f"GET {path} HTTP/1.0\r\nHost: dashboard\r\n\r\n".encode())
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).partition(b"\r\n\r\n")[2]


def test_dashboard_listens_only_on_a_private_socket(dash_cluster):
    sock_path = dash_cluster.extra["dashboard_socket"]
    assert registry.read("dash-t").extra["dashboard_socket"] == sock_path
    st, folder = os.stat(sock_path), os.stat(os.path.dirname(sock_path))
    assert stat.S_ISSOCK(st.st_mode) and st.st_uid == os.getuid()
    assert stat.S_IMODE(folder.st_mode) == 0o700 and stat.S_IMODE(st.st_mode) & 0o077 == 0
    server = dash_cluster.cluster.scheduler.http_server
    assert {s.family for s in server._sockets.values()} == {socket.AF_UNIX}  # no TCP port left
    with pytest.raises(OSError):  # the port Dask first bound is closed
        socket.create_connection(("127.0.0.1", server.port), timeout=2).close()
    assert b"Dask" in _raw_get(sock_path, "/status") or b"bokeh" in _raw_get(sock_path, "/status").lower()


def test_another_os_user_cannot_open_the_dashboard_socket(dash_cluster):
    if os.name != "posix" or os.geteuid() != 0 or not shutil_which("setpriv"):
        pytest.skip("needs root and setpriv to act as the OS user nobody")
    import pwd

    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("this machine has no 'nobody' user")
    code = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "try:\n    s.connect(sys.argv[1]); print('CONNECTED')\n"
        "except OSError as e:\n    print('REFUSED', type(e).__name__)\n"
    )
    out = subprocess.run(
        [
            "setpriv",
            f"--reuid={nobody.pw_uid}",
            f"--regid={nobody.pw_gid}",
            "--clear-groups",
            sys.executable,
            "-c",
            code,
            dash_cluster.extra["dashboard_socket"],
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ["PATH"], "HOME": "/tmp"},
        cwd="/",
    )
    assert "REFUSED PermissionError" in out.stdout, out.stdout + out.stderr


def shutil_which(name: str):
    import shutil

    return shutil.which(name)


def test_dashboard_is_served_through_the_authenticated_server(server, dash_cluster):
    # the panel's link is the server route under its (non-root) base_url
    def row():
        rows = requests.get(server.api("clusters"), headers=server.headers, timeout=30).json()["clusters"]
        return next((c for c in rows if c["name"] == "dash-t"), None)

    listed = wait_for(row, timeout=30, message="the cluster in the server's list")
    assert listed["dashboard_link"] == "/jc/jupyter-cluster/dashboard/dash-t/status"
    r = requests.get(_proxy_url(server, "dash-t"), headers=server.headers, timeout=30, allow_redirects=False)
    direct = _raw_get(dash_cluster.extra["dashboard_socket"], "/status")
    # the same page as on the socket (Bokeh's session ids differ per request: compare the title)
    assert r.status_code == 200 and b"<title>" in direct
    assert r.content.split(b"<title>")[1].split(b"</title>")[0] == direct.split(b"<title>")[1].split(b"</title>")[0]
    assert r.headers["Content-Type"].startswith("text/html")
    # the dashboard's own redirect stays under the route
    r = requests.get(_proxy_url(server, "dash-t", ""), headers=server.headers, timeout=30, allow_redirects=False)
    assert r.status_code in (301, 302) and r.headers["Location"] in (
        "status",
        "/jc/jupyter-cluster/dashboard/dash-t/status",
    )
    # no credentials, or wrong ones: Jupyter's auth answers, the dashboard never does
    r = requests.get(_proxy_url(server, "dash-t"), timeout=30, allow_redirects=False)
    assert r.status_code == 302 and r.headers["Location"].startswith("/jc/login")
    r = requests.get(
        _proxy_url(server, "dash-t"), headers={"Authorization": "token wrong"}, timeout=30, allow_redirects=False
    )
    assert r.status_code in (302, 403)
    # unknown or hostile names
    for name in ("no-such-cluster", "..%2F..%2Fetc"):
        r = requests.get(_proxy_url(server, name), headers=server.headers, timeout=30)
        assert r.status_code == 404, (name, r.status_code)


def test_dashboard_websockets_are_relayed(server, dash_cluster):
    """Bokeh's live updates are websockets: an echo route on the scheduler's HTTP app stands in for them."""
    import tornado.websocket
    from tornado.httpclient import HTTPClientError, HTTPRequest

    class Echo(tornado.websocket.WebSocketHandler):
        def on_message(self, message):
            self.write_message(f"echo:{message}")

    class Query(tornado.websocket.WebSocketHandler):
        def open(self):
            self.write_message(f"query:{self.request.query}")

    async def add_route():
        dash_cluster.cluster.scheduler.http_application.add_handlers(
            r".*", [(r"/echo-ws", Echo), (r"/query-ws", Query)]
        )

    dash_cluster.cluster.sync(add_route)
    url = _proxy_url(server, "dash-t", "echo-ws").replace("http://", "ws://")

    async def talk(headers):
        conn = await tornado.websocket.websocket_connect(HTTPRequest(url, headers=headers, connect_timeout=10))
        try:
            await conn.write_message("hello")
            return await asyncio.wait_for(conn.read_message(), 10)
        finally:
            conn.close()

    assert asyncio.run(talk(server.headers)) == "echo:hello"

    async def query_seen(query):
        target = _proxy_url(server, "dash-t", f"query-ws?{query}").replace("http://", "ws://")
        conn = await tornado.websocket.websocket_connect(HTTPRequest(target, connect_timeout=10))
        try:
            return await asyncio.wait_for(conn.read_message(), 10)
        finally:
            conn.close()

    # Bokeh's page puts its own query (with Jupyter's ?token=) on its websocket URL: the token stays here
    assert asyncio.run(query_seen(f"bokeh-session-id=s1&token={server.token}")) == "query:bokeh-session-id=s1"
    with pytest.raises(HTTPClientError) as refused:
        asyncio.run(talk({}))
    assert refused.value.code == 403


def test_panel_cluster_links_its_dashboard_under_the_servers_base_url(server):
    """A process the server starts (the panel's host) finds the server's base_url for its link."""
    r = requests.post(
        server.api("clusters"), json={"name": "dash-panel", "workers": 1}, headers=server.headers, timeout=180
    )
    assert r.status_code == 201, r.text
    try:
        record = registry.read("dash-panel")
        assert record.dashboard_link == "/jc/jupyter-cluster/dashboard/dash-panel/status"
        sock = record.extra["dashboard_socket"]
        r = requests.get(_proxy_url(server, "dash-panel"), headers=server.headers, timeout=30)
        assert r.status_code == 200
    finally:
        requests.delete(server.api("clusters/dash-panel"), headers=server.headers, timeout=60)
    wait_for(lambda: not os.path.exists(sock), timeout=30, message="the dashboard socket to go with its cluster")


def test_stopping_removes_the_socket_and_its_folder():
    handle = jc.start(workers=1, processes=False, name="dash-gone", wait=False)
    sock = handle.extra["dashboard_socket"]
    assert os.path.exists(sock)
    handle.close()
    assert not os.path.exists(os.path.dirname(sock))


def test_bokeh_dashboard_and_its_websocket_work_through_the_proxy(server, dash_cluster):
    """The real dashboard (bokeh installed, not Dask's "needs bokeh" page): its Bokeh session websocket is relayed."""
    import re

    import tornado.websocket
    from tornado.httpclient import HTTPRequest

    r = requests.get(_proxy_url(server, "dash-t", f"status?token={server.token}"), timeout=30)
    assert r.status_code == 200, r.status_code
    assert "needs bokeh" not in r.text and "Bokeh" in r.text, r.text[:500]
    # Bokeh's static files come through the proxy too
    script = re.search(r'src="([^"]*static/js/bokeh[^"]*\.js[^"]*)"', r.text)
    assert script, r.text[:2000]
    js = requests.get(requests.compat.urljoin(r.url, script.group(1)), headers=server.headers, timeout=30)
    assert js.status_code == 200 and len(js.content) > 10_000
    # the page's session token is the websocket's second subprotocol, as bokeh.js sends it
    session_token = re.search(r'"token"\s*:\s*"([^"]+)"', r.text).group(1)
    url = _proxy_url(server, "dash-t", "status/ws").replace("http://", "ws://")

    async def first_message():
        conn = await tornado.websocket.websocket_connect(
            HTTPRequest(url, headers=server.headers, connect_timeout=10), subprotocols=["bokeh", session_token]
        )
        try:
            assert conn.selected_subprotocol == "bokeh"
            return await asyncio.wait_for(conn.read_message(), 10)
        finally:
            conn.close()

    header = asyncio.run(first_message())
    assert header is not None and '"msgtype":"ACK"' in header.replace(" ", ""), header
