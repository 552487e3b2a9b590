"""A dask-gateway cluster's dashboard through the authenticated Jupyter server (issue 26, Security).

A real ``dask-gateway-server`` (local backend, password auth) and a real
``jupyter server`` (base_url ``/jc/``, token auth) whose dask.config logs into
the gateway; a gateway cluster started here.  Its dashboard link is the
server's route; pages and Bokeh's websocket come back through it with the
token, nothing without; paths that leave the cluster's dashboard (the
gateway's API, another host) are refused.
"""

from __future__ import annotations

import asyncio
import http.client
import os
import re

import pytest
import requests

from tests.conftest import wait_for
from tests.jupyter_process import JupyterProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    from tests.hpc.gateway_server import PASSWORD, running_gateway

    with running_gateway(tmp_path_factory.mktemp("gateway-dash")) as server:
        # the Jupyter server's own dask.config logs into the gateway (as a site's jupyter-cluster.yaml would)
        env = {
            "DASK_GATEWAY__AUTH__TYPE": "basic",
            "DASK_GATEWAY__AUTH__KWARGS__USERNAME": "alice",
            "DASK_GATEWAY__AUTH__KWARGS__PASSWORD": PASSWORD,
        }
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            jupyter = JupyterProcess(str(tmp_path_factory.mktemp("gw-dash-root")), base_url="/jc/").start()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        try:
            yield server, jupyter
        finally:
            jupyter.stop()


@pytest.fixture(scope="module")
def gw_cluster(gateway):
    import jupyter_cluster as jc

    handle = jc.start(backend="gateway", name="gw-dash", workers=0, adapt_max=1, wait=False)
    try:
        yield handle
    finally:
        if not handle.closed:
            handle.close()


def _route(server, path: str = "status") -> str:
    return f"/jc/jupyter-cluster/dashboard/gw-dash/{path}"


def _raw_status(server, path: str, headers: dict) -> int:
    """GET ``path`` exactly as written (no client-side normalising of dot segments)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def test_gateway_dashboard_comes_through_the_authenticated_route(gateway, gw_cluster):
    from jupyter_cluster.state import registry

    gw, server = gateway
    base = f"http://127.0.0.1:{server.port}"
    # the kernel's and the panel's link is the server's route, not the gateway's own
    assert registry.read("gw-dash").dashboard_link == "/jupyter-cluster/dashboard/gw-dash/status"
    assert not gw_cluster.dashboard_link.startswith(gw.address)

    def row():
        rows = requests.get(server.api("clusters"), headers=server.headers, timeout=30).json()["clusters"]
        return next((c for c in rows if c["name"] == "gw-dash"), None)

    listed = wait_for(row, timeout=60, message="the gateway cluster in the server's list")
    assert listed["dashboard_link"] == _route(server)

    # a dashboard page, as the gateway serves it for this cluster
    plots = wait_for(
        lambda: (
            r
            if (
                r := requests.get(base + _route(server, "individual-plots.json"), headers=server.headers, timeout=60)
            ).status_code
            == 200
            else None
        ),
        timeout=90,
        message="the gateway's dashboard of the cluster through the route",
    )
    assert isinstance(plots.json(), dict) and any("Task Stream" in k for k in plots.json()), plots.text[:300]
    page = requests.get(base + _route(server, f"status?token={server.token}"), timeout=60)
    assert page.status_code == 200 and "Bokeh" in page.text and "needs bokeh" not in page.text, page.text[:300]

    # the dashboard's own redirect stays under the route
    r = requests.get(base + _route(server, ""), headers=server.headers, timeout=60, allow_redirects=False)
    assert r.status_code in (301, 302) and r.headers["Location"] in ("status", _route(server)), (
        r.status_code,
        r.headers.get("Location"),
    )

    # without Jupyter's credentials (or with wrong ones): Jupyter's auth answers, the gateway never does
    r = requests.get(base + _route(server, "individual-plots.json"), timeout=30, allow_redirects=False)
    assert r.status_code in (302, 403) and "Task Stream" not in r.text
    if r.status_code == 302:
        assert r.headers["Location"].startswith("/jc/login")
    r = requests.get(
        base + _route(server, "individual-plots.json"),
        headers={"Authorization": "token wrong"},
        timeout=30,
        allow_redirects=False,
    )
    assert r.status_code in (302, 403) and "Task Stream" not in r.text

    # Bokeh's session websocket is relayed (with the token; refused without)
    import tornado.websocket
    from tornado.httpclient import HTTPClientError, HTTPRequest

    session_token = re.search(r'"token"\s*:\s*"([^"]+)"', page.text).group(1)
    ws_url = (base + _route(server, "status/ws")).replace("http://", "ws://")

    async def first_message(headers):
        conn = await tornado.websocket.websocket_connect(
            HTTPRequest(ws_url, headers=headers, connect_timeout=30), subprotocols=["bokeh", session_token]
        )
        try:
            return await asyncio.wait_for(conn.read_message(), 30)
        finally:
            conn.close()

    header = asyncio.run(first_message(server.headers))
    assert header is not None and '"msgtype":"ACK"' in header.replace(" ", ""), header
    with pytest.raises(HTTPClientError) as refused:
        asyncio.run(first_message({}))
    assert refused.value.code == 403


def test_paths_outside_the_clusters_dashboard_are_refused(gateway, gw_cluster):
    gw, server = gateway
    auth = server.headers
    # the gateway's own API (its cluster list, with alice's login) is not under the cluster's dashboard
    for path in (
        "%2E%2E/%2E%2E/api/v1/clusters/",
        "..%2F..%2Fapi%2Fv1%2Fclusters%2F",
        "status/%2E%2E/%2E%2E/%2E%2E/api/v1/clusters/",
        f"http://127.0.0.1:{gw.port}/api/v1/clusters/",  # another URL, host and all
        "http:%2F%2F192.0.2.1/",
        "%2F%2F192.0.2.1/status",  # a scheme-relative one
        "status%5C..%5C..%5Capi",
    ):
        assert _raw_status(server, _route(server, path), auth) == 400, path
    # only registered clusters: a gateway cluster's own name, an unknown name, are not routes
    cluster = gw_cluster.extra["gateway"]["cluster"]
    for name in (cluster, "no-such-cluster"):
        assert _raw_status(server, f"/jc/jupyter-cluster/dashboard/{name}/status", auth) == 404, name
    # a sane path through the same route still works
    assert _raw_status(server, _route(server, "individual-plots.json"), auth) == 200


def test_gateway_login_headers_come_from_dask_config_and_never_cross_plain_http(gateway):
    import base64

    import dask

    from jupyter_cluster.server.gateway_dashboard import (
        Refused,
        auth_headers,
        dashboard_prefixes,
        gateway_target,
        upstream_url,
    )
    from tests.hpc.gateway_server import PASSWORD

    gw, _ = gateway
    headers = auth_headers(gw.address)
    assert headers == {"Authorization": "Basic " + base64.b64encode(f"alice:{PASSWORD}".encode()).decode()}
    with pytest.raises(Refused, match="plain http:// to another machine"):
        auth_headers("http://192.0.2.1:8000")
    with dask.config.set({"gateway.auth.type": "basic", "gateway.auth.kwargs": {"username": "alice"}}):
        assert auth_headers("http://192.0.2.1:8000") == {
            "Authorization": "Basic " + base64.b64encode(b"alice:").decode()
        }
    # what the registry's record must hold to be forwarded
    assert gateway_target({"gateway": {"address": "http://g:1/", "cluster": "ns.abc"}}) == ("http://g:1", "ns.abc")
    for bad in (
        {"gateway": {"address": "file:///etc", "cluster": "ns.abc"}},
        {"gateway": {"address": "http://g:1", "cluster": "../api"}},
        {"gateway": {"address": "http://g:1", "cluster": "a/b"}},
        {"dashboard_socket": "/tmp/x"},
        None,
    ):
        assert gateway_target(bad) is None, bad
    assert upstream_url("http://g:1", "ns.abc", "status", "a=1") == "http://g:1/clusters/ns.abc/status?a=1"
    assert upstream_url("http://g:1", "ns.abc", "a b/c") == "http://g:1/clusters/ns.abc/a%20b/c"
    assert dashboard_prefixes("http://g:1/clusters/ns.abc/status?a=1") == (
        "http://g:1/clusters/ns.abc/",
        "/clusters/ns.abc/",
    )
