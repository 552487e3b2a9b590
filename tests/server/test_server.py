"""The Jupyter server extension, against a real ``jupyter server`` on loopback.

One server (non-root base_url, token auth) is shared by the module.  Clusters
are real: one started through the REST API (owned by a panel host process),
others by plain Python processes standing in for kernels.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest
import requests

from ..conftest import wait_for
from ..jupyter_process import JupyterProcess
from ..wire.test_envelopes import check_envelope

pytestmark = pytest.mark.timeout(240)

ROUTES = [
    ("GET", "clusters"),
    ("POST", "clusters"),
    ("GET", "clusters/x"),
    ("DELETE", "clusters/x"),
    ("POST", "clusters/x/scale"),
    ("POST", "clusters/x/adapt"),
    ("GET", "clusters/x/metrics"),
    ("GET", "clusters/x/metrics/t"),
    ("GET", "jobs"),
    ("GET", "config"),
    ("GET", "events"),
]

KERNEL_SCRIPT = textwrap.dedent(
    """
    import sys, time
    import jupyter_cluster as jc

    if __name__ == "__main__":
        # thread workers: a cluster needs one (issue 25.6), and these stand-ins are cheap on 2 cores
        handle = jc.start(name=sys.argv[1], workers=int(sys.argv[2]), threads=1, processes=False)
        print("ready", flush=True)
        while not handle.closed:
            time.sleep(0.1)
        print("closed", flush=True)
    """
)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("server-root")
    proc = JupyterProcess(str(root), app="server", base_url="/jc/").start()
    yield proc
    proc.stop()
    _stop_panel_clusters()


def _stop_panel_clusters() -> None:
    """Panel clusters outlive the server by design: end the ones this module left."""
    from jupyter_cluster.state import registry

    for rec in registry.live_records():
        if rec.owner_kind == "panel" and rec.owner_alive():
            os.kill(rec.owner_pid, signal.SIGTERM)
    wait_for(
        lambda: not any(r.owner_kind == "panel" for r in registry.live_records()), 30, message="panel clusters to stop"
    )


@pytest.fixture
def api(server):
    """requests with the token header, JSON errors readable on failure."""

    class Api:
        def __call__(self, method: str, path: str, **kw):
            kw.setdefault("timeout", 120)
            return requests.request(method, server.api(path), headers=server.headers, **kw)

        def ok(self, method: str, path: str, status: int = 200, **kw):
            r = self(method, path, **kw)
            assert r.status_code == status, f"{method} {path}: {r.status_code} {r.text}"
            return r.json()

        def names(self) -> list[str]:
            return [c["name"] for c in self.ok("GET", "clusters")["clusters"]]

    return Api()


def start_kernel_like(name: str, workers: int = 1) -> subprocess.Popen:
    """A Python process that starts a cluster of thread workers (like a kernel would) and keeps it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", KERNEL_SCRIPT, name, str(workers)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    line = proc.stdout.readline()
    assert line.strip() == "ready", f"the cluster process did not start (exit {proc.poll()})"
    return proc


# -- authentication and XSRF ---------------------------------------------------------
@pytest.mark.parametrize("method,path", ROUTES)
def test_every_route_refuses_requests_without_credentials(server, method, path):
    r = requests.request(method, server.api(path), timeout=30, json={} if method == "POST" else None)
    assert r.status_code in (401, 403), f"{method} {path} answered {r.status_code} without credentials"


def test_websocket_refuses_without_credentials(server):
    import websocket

    url = server.api("events").replace("http://", "ws://")
    with pytest.raises(websocket.WebSocketBadStatusException) as info:
        websocket.create_connection(url, timeout=10)
    assert info.value.status_code in (401, 403)


@pytest.mark.parametrize(
    "method,path",
    [("POST", "clusters"), ("DELETE", "clusters/x"), ("POST", "clusters/x/scale"), ("POST", "clusters/x/adapt")],
)
def test_writes_need_the_xsrf_token_with_cookie_login(server, method, path):
    """A browser session (cookie) must send X-XSRFToken on every write."""
    s = requests.Session()
    assert s.get(f"{server.url}lab?token={server.token}", timeout=60).status_code == 200
    assert "_xsrf" in s.cookies, "the login page set no _xsrf cookie"
    assert s.get(server.api("clusters"), timeout=30).status_code == 200  # the cookie logs us in
    body = {"workers": 1, "name": "bad name"}
    refused = s.request(method, server.api(path), json=body, timeout=30)
    assert refused.status_code == 403, refused.text
    assert "xsrf" in refused.json()["message"].lower()
    passed = s.request(method, server.api(path), json=body, headers={"X-XSRFToken": s.cookies["_xsrf"]}, timeout=30)
    assert passed.status_code in (400, 404), passed.text  # past XSRF; refused for its content


# -- input validation --------------------------------------------------------------------
@pytest.mark.parametrize(
    "method,path,body,status,words",
    [
        ("POST", "clusters", {"workers": -1}, 400, "workers must be a whole number"),
        ("POST", "clusters", {"workers": "2"}, 400, "workers must be a whole number"),
        ("POST", "clusters", {"threads": 0}, 400, "threads must be a whole number"),
        ("POST", "clusters", {"name": "no spaces"}, 400, "not a valid cluster name"),
        ("POST", "clusters", {"colour": "red"}, 400, "unknown field"),
        ("POST", "clusters", {"backend": "nope"}, 400, "unknown backend"),
        ("POST", "clusters", {"memory_limit": "lots"}, 400, "memory_limit must be a size"),
        ("POST", "clusters", {"workers": 0}, 400, "0 workers can run nothing"),
        ("POST", "clusters", [1, 2], 400, "must be a JSON object"),
        ("POST", "clusters/x/scale", {"workers": 10**6}, 400, "workers must be a whole number"),
        ("POST", "clusters/x/scale", {}, 400, "give the number of workers"),
        ("POST", "clusters/x/scale", {"workers": 2}, 404, "no live cluster named 'x'"),
        ("POST", "clusters/x/adapt", {"minimum": 3, "maximum": 1}, 400, "at least minimum"),
        ("DELETE", "clusters/bad%20name", None, 400, "not a valid cluster name"),
        ("GET", "clusters/x", None, 404, "no live cluster named 'x'"),
        ("GET", "clusters/x/metrics", None, 404, "no live cluster"),
        ("GET", "clusters/x/metrics/t", None, 404, "no live cluster"),
        ("GET", "jobs?cluster=x", None, 404, "no live cluster"),
    ],
)
def test_bad_input_gets_a_json_message(api, method, path, body, status, words):
    r = api(method, path, json=body)
    assert r.status_code == status, r.text
    assert words in r.json()["message"]


@pytest.mark.parametrize(
    "raw",
    [
        '"1e999GB"',  # overflowed int() in parse_bytes: a 500 (issue 25.6)
        "1e999",  # JSON's overflowing number is a float infinity
        '"inf"',
        '"infGB"',
        '"nan"',
        '"nanGB"',
        "NaN",
        "-Infinity",
        '"-1GB"',
        '"-5"',
        "-1",
        "0",
        '"0"',
        '"0.1B"',
        str(2**64),
        "1" + "0" * 400,
        "2.5",
        "true",
        "false",
        '""',
        "[]",
        '["2GiB"]',
        '{"size": "2GiB"}',
        '"12 parsecs"',
        '"GB GB"',
        '"GiB"',
        '"' + "9" * 40 + '"',
        '"2GiB\\u0000"',
    ],
)
def test_every_malformed_memory_limit_is_a_400(api, raw):
    r = api("POST", "clusters", data='{"memory_limit": ' + raw + "}")
    assert r.status_code == 400, (raw, r.status_code, r.text)
    message = r.json()["message"]
    assert message.startswith('memory_limit must be a size such as "2GiB"'), message
    assert message.endswith(".") and message.count(". ") == 0, message  # one sentence


#: malformed adapt bodies (issue 37.6: 19 of 31 like these answered 200 and scaled the cluster to zero)
BAD_ADAPT = [
    ({"min": 2, "max": 2}, "'max', 'min'"),
    ({"min": 2}, "'min'"),
    ({"Minimum": 1, "maximum": 2}, "'Minimum'"),
    ({"minimum": 1, "maximum": 2, "workers": 3}, "'workers'"),
    ({"minimum": 1, "maxium": 2}, "'maxium'"),
    ({"n": 2}, "'n'"),
    ({}, "give the bounds"),
    ({"minimum": None, "maximum": None}, "give the bounds"),
    ({"minimum": "2"}, "minimum must be a whole number"),
    ({"minimum": 2.0}, "minimum must be a whole number"),
    ({"minimum": True}, "minimum must be a whole number"),
    ({"minimum": -1}, "minimum must be a whole number"),
    ({"minimum": [2]}, "minimum must be a whole number"),
    ({"maximum": "inf"}, "maximum must be a whole number"),
    ({"maximum": {"n": 2}}, "maximum must be a whole number"),
    ({"minimum": 3, "maximum": 1}, "at least minimum"),
]


@pytest.mark.parametrize("body,words", BAD_ADAPT)
def test_every_malformed_adapt_body_is_a_400_naming_the_field(api, body, words):
    """Refused before the cluster is looked up (a 404 for 'x' would mean the body was taken)."""
    r = api("POST", "clusters/x/adapt", json=body)
    assert r.status_code == 400, (body, r.status_code, r.text)
    message = r.json()["message"]
    assert words in message and message.endswith(".") and message.count(". ") == 0, message


@pytest.mark.parametrize("method,path", [r for r in ROUTES if r[1] != "events"])
def test_every_route_refuses_an_unknown_field_and_query_argument(api, method, path):
    """One check for all routes: a field or query argument a route does not take is a 400 naming it."""
    r = api(method, path, params={"colour": "red"}, json={"workers": 1} if method == "POST" else None)
    assert r.status_code == 400 and "unknown query argument 'colour'" in r.json()["message"], (path, r.text)
    r = api(method, path, json={"colour": "red"})
    assert r.status_code == 400 and "unknown field 'colour'" in r.json()["message"], (path, r.text)


def test_bad_json_body(api):
    r = api("POST", "clusters", data="{not json")
    assert r.status_code == 400 and r.json()["message"] == "the request body is not valid JSON."


def test_deeply_nested_json_is_a_400_not_a_500(api, server):
    """JSON nested 100,000 deep overflowed the parser's recursion: a 500 (issue 18.12)."""
    import websocket

    deep = "[" * 100_000 + "]" * 100_000
    for path in ("clusters", "clusters/x/scale", "clusters/x/adapt"):
        r = api("POST", path, data=deep)
        assert r.status_code == 400 and r.json()["message"] == "the request body is not valid JSON.", (
            path,
            r.status_code,
        )
    ws = websocket.create_connection(
        server.api("events").replace("http://", "ws://"), header=[f"Authorization: token {server.token}"], timeout=20
    )
    try:
        ws.send('{"type": ' + deep + "}")
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            msg = json.loads(ws.recv())
            if msg["type"] == "error":
                assert msg["message"].startswith("bad message")
                break
        else:
            pytest.fail("no error message for a deeply nested websocket message")
        ws.send(json.dumps({"type": "interval", "ms": 500}))  # the socket still works
        ws.send(json.dumps({"type": "watch", "cluster": None, "topix": ["t"]}))  # a misspelt field: named
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            msg = json.loads(ws.recv())
            if msg["type"] == "error":
                assert "unknown field 'topix'" in msg["message"], msg
                break
        else:
            pytest.fail("no error message for a watch message with an unknown field")
    finally:
        ws.close()


def test_the_server_log_keeps_out_errors_of_a_client_reconnecting_to_a_stopped_scheduler(caplog):
    """Closing the server's client while its reconnect is in a TLS handshake raised tornado's ValueError in CI."""
    import logging

    from distributed.comm import CommClosedError

    from jupyter_cluster.server import manager  # noqa: F401  (installs the filter)

    def _reconnect():  # named as distributed.Client's, in whose frames the error is raised
        try:
            raise CommClosedError("Client->Scheduler: Stream is closed")
        except CommClosedError:
            raise ValueError("IOStream is not idle; cannot convert to SSL") from None

    log = logging.getLogger("distributed.client")
    with caplog.at_level(logging.ERROR, logger="distributed.client"):
        try:
            _reconnect()
        except ValueError as exc:
            log.exception(exc)
        try:
            raise ValueError("a real error elsewhere")
        except ValueError as exc:
            log.exception(exc)
    assert [r.getMessage() for r in caplog.records] == ["a real error elsewhere"]


def test_config_names_the_default_backend(api):
    cfg = api.ok("GET", "config")
    assert cfg["backend"] == "local" and "local" in cfg["backends"]


# -- a cluster started by another process appears, and goes when it dies ----------------
def test_cluster_of_another_process_appears_within_2s_and_goes_after_kill_9(api):
    proc = start_kernel_like("proc-a")
    try:
        t0 = time.monotonic()
        wait_for(lambda: "proc-a" in api.names(), 2.0, interval=0.05, message="proc-a in the list")
        appeared = time.monotonic() - t0
        assert appeared < 2.0, f"proc-a took {appeared:.2f} s to appear"
        row = next(c for c in api.ok("GET", "clusters")["clusters"] if c["name"] == "proc-a")
        assert row["owner_kind"] == "kernel" and row["owner_pid"] == proc.pid
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        t1 = time.monotonic()
        wait_for(lambda: "proc-a" not in api.names(), 30.0, interval=0.1, message="proc-a to disappear")
        gone = time.monotonic() - t1
        print(f"appeared after {appeared:.2f} s, gone {gone:.2f} s after kill -9")
    finally:
        if proc.poll() is None:
            proc.kill()


def test_stop_from_the_panel_asks_the_owning_kernel(api):
    proc = start_kernel_like("proc-b")
    try:
        wait_for(lambda: "proc-b" in api.names(), 5, message="proc-b in the list")
        wait_for(
            lambda: (
                next(c for c in api.ok("GET", "clusters")["clusters"] if c["name"] == "proc-b")["status"] == "running"
            ),
            15,
            message="server connected to proc-b",
        )
        assert api.ok("DELETE", "clusters/proc-b") == {"stopped": "proc-b"}
        assert "proc-b" not in api.names()
        # The owner closed its own handle (its loop ends and it says so).
        assert proc.stdout.readline().strip() == "closed"
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_stop_from_the_panel_stops_only_the_cluster_it_showed(api):
    """A card's Stop names the cluster's id: a later cluster that took the name is not stopped."""
    proc = start_kernel_like("proc-id")
    try:
        wait_for(lambda: "proc-id" in api.names(), 5, message="proc-id in the list")
        row = next(c for c in api.ok("GET", "clusters")["clusters"] if c["name"] == "proc-id")
        assert isinstance(row["id"], str) and len(row["id"]) == 16
        r = api("DELETE", "clusters/proc-id", params={"id": "0123456789abcdef"})  # an earlier proc-id's card
        assert r.status_code == 409 and "another cluster now has that name" in r.json()["message"]
        assert "proc-id" in api.names() and proc.poll() is None
        assert api.ok("DELETE", "clusters/proc-id", params={"id": row["id"]}) == {"stopped": "proc-id"}
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


# An owner that stops its cluster on a stop request before any answer reaches the server: the
# race a real owner can lose (it answers, then closes; the scheduler may die before passing it on).
SILENT_OWNER_SCRIPT = textwrap.dedent(
    """
    import sys, threading
    from distributed import Client, LocalCluster
    from jupyter_cluster.state import registry
    from jupyter_cluster.telemetry.topic_names import CONTROL_TOPIC

    if __name__ == "__main__":
        name = sys.argv[1]
        cluster = LocalCluster(n_workers=0, processes=False, protocol="tcp", host="127.0.0.1", dashboard_address=":0")
        client = Client(cluster)
        asked = threading.Event()

        def on_control(event):
            msg = event[1]
            if isinstance(msg, dict) and msg.get("op") == "stop" and msg.get("cluster") == name:
                asked.set()

        client.subscribe_topic(CONTROL_TOPIC, on_control)
        registry.write(registry.ClusterRecord(name=name, backend="local", address=cluster.scheduler_address))
        print("ready", flush=True)
        asked.wait(120)
        client.close()
        cluster.close()  # no answer: the scheduler goes first
        registry.remove(name)
        print("closed", flush=True)
    """
)


def test_stop_from_the_panel_counts_an_owner_that_stops_before_its_answer_arrives(api):
    proc = subprocess.Popen(
        [sys.executable, "-c", SILENT_OWNER_SCRIPT, "proc-silent"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "ready", f"the owner did not start (exit {proc.poll()})"
        wait_for(lambda: "proc-silent" in api.names(), 10, message="proc-silent in the list")
        # at once, connected or not yet: the server reaches the scheduler for the request if it must
        assert api.ok("DELETE", "clusters/proc-silent") == {"stopped": "proc-silent"}
        assert "proc-silent" not in api.names()
        assert proc.stdout.readline().strip() == "closed"
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_kernel_that_connects_by_name_is_listed_with_the_cluster_from_the_connect_on(api, tmp_path):
    """The panel follows a notebook to the cluster it attached to by name, before any map.

    A real kernel (connection file ``kernel-<id>.json``, as a Jupyter server
    names it) does ``%cluster connect NAME`` to another process's cluster: the
    cluster's row lists the kernel's id; after ``%cluster stop`` (a detach) and
    after the kernel is killed, it no longer does.
    """

    from ..helpers import kernel_ok, start_jupyter_named_kernel, stop_jupyter_named_kernel

    def kernels() -> list[str]:
        return next(c for c in api.ok("GET", "clusters")["clusters"] if c["name"] == "proc-k")["kernels"]

    owner = start_kernel_like("proc-k")
    km, kc, kernel_id = start_jupyter_named_kernel(tmp_path)
    try:
        wait_for(lambda: "proc-k" in api.names(), 5, message="proc-k in the list")
        assert kernels() == []
        kernel_ok(kc, "%load_ext jupyter_cluster\n%cluster connect proc-k")
        wait_for(lambda: kernels() == [kernel_id], 2.0, interval=0.05, message="the kernel listed with proc-k")
        assert api.names().count("proc-k") == 1  # an attachment adds no row
        kernel_ok(kc, "%cluster stop proc-k")
        wait_for(lambda: kernels() == [], 2.0, interval=0.05, message="the detached kernel to leave proc-k")
        kernel_ok(kc, "%cluster connect proc-k")
        wait_for(lambda: kernels() == [kernel_id], 2.0, interval=0.05, message="the kernel listed again")
        km.shutdown_kernel(now=True)
        wait_for(lambda: kernels() == [], 5.0, interval=0.05, message="the killed kernel to leave proc-k")
        assert "proc-k" in api.names()  # the owner's cluster runs on
    finally:
        stop_jupyter_named_kernel(km, kc)
        owner.kill()
        owner.wait(10)


def test_an_attachment_counts_only_for_the_cluster_it_attached_to():
    """A later cluster of the same name at another address is not the one the kernel attached to."""
    from jupyter_cluster.server.manager import _attached_kernels
    from jupyter_cluster.state import registry

    owned = registry.ClusterRecord(name="c1", backend="local", address="tcp://127.0.0.1:21")
    by_address = registry.ClusterRecord(
        name="remote-1", backend="address", address="tcp://127.0.0.1:21", attached=True, kernel_id="k-addr"
    )
    by_address.started = owned.started + 2
    same = registry.Attachment(name="c1", address="tcp://127.0.0.1:21", kernel_id="k-name")
    same.started = owned.started + 1
    older_cluster = registry.Attachment(name="c1", address="tcp://127.0.0.1:99", kernel_id="k-old")
    no_kernel = registry.Attachment(name="c1", address="tcp://127.0.0.1:21")  # a script: nothing to follow
    unknown = registry.Attachment(name="gone", address="tcp://127.0.0.1:22", kernel_id="k-gone")
    assert _attached_kernels([owned, by_address], [same, older_cluster, no_kernel, unknown]) == {
        "tcp://127.0.0.1:21": ["k-name", "k-addr"]
    }


def test_stop_answers_when_a_refresh_retires_the_cluster_it_waits_to_reach(tmp_path, monkeypatch):
    """The refresh's close() cancelled the connect attempt Stop waited on: the panel's Stop got a 500.

    A real manager and registry; the scheduler is a socket that accepts and
    never answers, so each connect attempt waits out its timeout (the scan's
    wait for it cut from 15 s to 2 s here: the attempt goes on behind it).
    """
    import asyncio
    import socket

    from jupyter_cluster.server.manager import ClusterManager
    from jupyter_cluster.state import registry

    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))

    async def main(address: str) -> None:
        registry.write(registry.ClusterRecord(name="mute-1", backend="local", address=address, owner_kind="process"))
        manager = ClusterManager(interval=60, poll_timeout=2)
        try:
            await manager.refresh()  # the first attempt fails: no client
            conn = manager.connections["mute-1"]
            assert conn.client is None
            stop = asyncio.ensure_future(manager.stop("mute-1", timeout=10))
            await asyncio.sleep(0.5)
            assert not stop.done()  # waiting in reach() for a new attempt
            registry.remove("mute-1")  # the cluster stops meanwhile
            await manager.refresh()  # and the refresh retires its connection, cancelling the attempt
            await asyncio.wait_for(stop, 10)  # Stop answers: what was asked for has happened
            assert "mute-1" not in manager.connections
        finally:
            await manager.close()

    with socket.socket() as mute:
        mute.bind(("127.0.0.1", 0))
        mute.listen(8)
        asyncio.run(main(f"tcp://127.0.0.1:{mute.getsockname()[1]}"))


def test_a_listed_cluster_not_yet_reached_has_the_lists_view_in_its_detail(api):
    """``GET clusters/NAME`` answered 400 "does not answer right now" while the list showed the cluster (issue 37.7).

    The scheduler is a socket that accepts and never answers: the server lists the record
    but its connection is never made.  The detail gives the record's view with the list's status.
    """
    import socket

    from jupyter_cluster.state import registry

    with socket.socket() as mute:
        mute.bind(("127.0.0.1", 0))
        mute.listen(8)
        address = f"tcp://127.0.0.1:{mute.getsockname()[1]}"
        registry.write(
            registry.ClusterRecord(name="mute-detail", backend="local", address=address, owner_kind="process")
        )
        try:

            def listed() -> dict:
                return {c["name"]: c for c in api.ok("GET", "clusters")["clusters"]}.get("mute-detail") or {}

            wait_for(lambda: listed(), 30, interval=0.1, message="the record listed")
            for _ in range(3):
                row = listed()
                detail = api.ok("GET", "clusters/mute-detail")
                assert detail["status"] == row["status"] in ("connecting", "unreachable"), (row, detail)
                assert detail["workers"] == [] and detail["address"] == address and detail["name"] == "mute-detail"
                assert detail["n_workers"] == row["n_workers"]
                time.sleep(0.2)
        finally:
            registry.remove("mute-detail")
    wait_for(lambda: "mute-detail" not in api.names(), 30, message="the record gone from the list")


READ_ONLY_CONFIG = textwrap.dedent(
    """
    from jupyter_server.auth.authorizer import Authorizer


    class ReadOnlyClusters(Authorizer):
        # as a deployment's authorizer (JupyterHub's read-only access): watch the clusters, change none
        def is_authorized(self, handler, user, action, resource):
            return not (resource == "jupyter_cluster" and action != "read")


    c.ServerApp.authorizer_class = ReadOnlyClusters
    """
)


def test_a_read_only_user_watches_the_clusters_but_cannot_start_scale_or_stop_them(tmp_path):
    """Every route was authenticated but put to no authorizer: a read-only user could Scale and Stop."""
    import websocket

    config = tmp_path / ".jupyter-config"
    config.mkdir()
    (config / "jupyter_server_config.py").write_text(READ_ONLY_CONFIG)
    server = JupyterProcess(str(tmp_path), app="server").start(timeout=120)
    try:

        def call(method: str, path: str, **kw: Any) -> requests.Response:
            return requests.request(method, server.api(path), headers=server.headers, timeout=60, **kw)

        for path in ("clusters", "jobs", "runs", "config"):
            assert call("GET", path).status_code == 200, path
        assert call("GET", "clusters/nothing-1").status_code == 404  # read: on to the handler
        for method, path, body in [
            ("POST", "clusters", {"name": "denied-1", "workers": 1}),
            ("POST", "clusters/nothing-1/scale", {"workers": 2}),
            ("POST", "clusters/nothing-1/adapt", {"minimum": 0, "maximum": 2}),
            ("DELETE", "clusters/nothing-1", None),
        ]:
            r = call(method, path, json=body)
            assert r.status_code == 403, f"{method} {path}: {r.status_code} {r.text}"
            assert "not authorized to write" in r.json()["message"]
        dashboard = f"{server.url}jupyter-cluster/dashboard/nothing-1/status"  # the dashboard proxy: the same rule
        assert requests.get(dashboard, headers=server.headers, timeout=60).status_code == 404
        assert requests.post(dashboard, headers=server.headers, timeout=60).status_code == 403
        url = server.api("events").replace("http://", "ws://")
        ws = websocket.create_connection(url, header=[f"Authorization: token {server.token}"], timeout=30)
        try:
            assert json.loads(ws.recv())["type"] == "clusters"  # the events socket only reads
        finally:
            ws.close()
    finally:
        server.stop()
        from jupyter_cluster.state import registry

        started = registry.read("denied-1")  # (only were the POST let through: a panel cluster outlives its server)
        if started is not None and started.owner_is_panel_host():
            os.kill(started.owner_pid, signal.SIGTERM)


# -- a panel cluster: start, details, scale, adapt, jobs, metrics, push, stop ------------
@pytest.fixture(scope="module")
def panel_cluster(server):
    r = requests.post(
        server.api("clusters"), headers=server.headers, json={"name": "panel-t", "workers": 1}, timeout=180
    )
    assert r.status_code == 201, r.text
    yield r.json()["cluster"]
    from jupyter_cluster.state import registry

    if registry.read("panel-t") is not None:
        requests.delete(server.api("clusters/panel-t"), headers=server.headers, timeout=60)


def test_panel_cluster_is_listed_with_its_owner(api, panel_cluster):
    assert panel_cluster["name"] == "panel-t" and panel_cluster["owner_kind"] == "panel"
    assert panel_cluster["backend"] == "local" and panel_cluster["address"].startswith("tls://127.0.0.1:")
    row = next(c for c in api.ok("GET", "clusters")["clusters"] if c["name"] == "panel-t")
    assert row["dashboard_link"] and row["status"] == "running"
    detail = api.ok("GET", "clusters/panel-t")
    assert detail["n_workers"] == 1 and len(detail["workers"]) == 1
    w = detail["workers"][0]
    assert {"name", "status", "cpu", "memory", "memory_limit", "executing", "nthreads"} <= set(w)
    assert w["status"] == "running" and w["memory_limit"] > 0


def test_duplicate_name_is_refused(api, panel_cluster):
    r = api("POST", "clusters", json={"name": "panel-t"})
    assert r.status_code == 400 and "already exists" in r.json()["message"]


def test_scale_and_adapt_reach_the_owner(api, panel_cluster):
    assert api.ok("POST", "clusters/panel-t/scale", json={"workers": 2})["workers"] == 2
    wait_for(lambda: api.ok("GET", "clusters/panel-t")["n_workers"] == 2, 60, interval=0.2, message="2 workers")
    assert api.ok("POST", "clusters/panel-t/adapt", json={"minimum": 1, "maximum": 2})["maximum"] == 2
    listed = {c["name"]: c for c in api.ok("GET", "clusters")["clusters"]}
    assert listed["panel-t"]["adaptive"] == {"minimum": 1, "maximum": 2}  # the panel draws its card apart
    assert api.ok("POST", "clusters/panel-t/scale", json={"workers": 1})["workers"] == 1
    assert "adaptive" not in api.ok("GET", "clusters/panel-t")
    wait_for(lambda: api.ok("GET", "clusters/panel-t")["n_workers"] == 1, 60, interval=0.2, message="back to 1 worker")


def _client(name: str):
    from distributed import Client

    from jupyter_cluster.state import registry
    from jupyter_cluster.state.credentials import saved_security

    return Client(registry.read(name).address, timeout=10, set_as_default=False, security=saved_security(name))


def _job(job: str, now: float, **fields: Any) -> dict[str, Any]:
    """A map job's update as a kernel publishes it (:func:`jupyter_cluster.wire.models.job_message`).

    One item, none done, running since ``now``, unless ``fields`` say otherwise.
    """
    from jupyter_cluster.wire.models import job_message

    args: dict[str, Any] = dict(
        label=job,
        kernel=os.getpid(),
        cluster=None,
        total=1,
        done=0,
        failed=0,
        state="running",
        started=now,
        updated=now,
    )
    return dict(job_message(job, **{**args, **fields}))


def test_jobs_and_metrics_published_on_the_cluster_reach_the_api(api, panel_cluster):
    from jupyter_cluster import telemetry

    client = _client("panel-t")
    try:
        now = time.time()
        failure = {"index": 2, "error": "ValueError: bad 2", "traceback": "", "worker": "tcp://w:1", "item": "'b'"}
        job = _job("job-1", now, label="%%parallel cell", cluster="x", total=10, done=4, failed=1, failures=[failure])
        client.log_event(telemetry.JOBS_TOPIC, job)

        def report_on_worker(i):
            import jupyter_cluster

            jupyter_cluster.report(step=i, topic="rl-test", member=i % 2, reward=float(i), load=[i, 1, 2, 3])
            return i

        assert client.gather(client.map(report_on_worker, range(6))) == list(range(6))
        jobs = wait_for(lambda: api.ok("GET", "jobs")["running"], 10, message="job in /jobs")
        assert jobs[0]["job"] == "job-1" and jobs[0]["done"] == 4 and jobs[0]["failed"] == 1
        assert jobs[0]["cluster"] == "panel-t"
        # the failed item crossed the scheduler (msgpack hands its list back as a tuple) and is listed
        assert jobs[0]["failures"] == [
            {"index": 2, "error": "ValueError: bad 2", "traceback": "", "worker": "tcp://w:1", "item": "'b'"}
        ]
        topics = wait_for(lambda: api.ok("GET", "clusters/panel-t/metrics")["topics"], 10, message="a metrics topic")
        assert topics[0]["topic"] == "rl-test"
        model = wait_for(
            lambda: (m := api.ok("GET", "clusters/panel-t/metrics/rl-test"))["received"] == 6 and m,
            10,
            message="6 reports",
        )
        assert sorted(model["scalars"]["reward"]) == ["member=0", "member=1"]
        assert model["scalars"]["reward"]["member=1"] == [[1, 1.0], [3, 3.0], [5, 5.0]]
        rows = model["vectors"]["load"]["member=0"]
        assert rows["steps"] == [0, 2, 4] and rows["rows"][1] == [2.0, 1.0, 2.0, 3.0]
        assert model["dropped"] == 0
        client.log_event(telemetry.JOBS_TOPIC, dict(job, done=10, state="finished", updated=time.time()))
        recent = wait_for(lambda: api.ok("GET", "jobs")["recent"], 10, message="finished job")
        assert recent[0]["state"] == "finished" and recent[0]["done"] == 10
    finally:
        client.close()


def test_websocket_pushes_clusters_workers_and_metrics(server, api, panel_cluster):
    import websocket

    # Its own reports, on a topic of its own: what the socket pushes must not depend on other tests.
    client = _client("panel-t")
    try:

        def report_on_worker(i):
            import jupyter_cluster

            jupyter_cluster.report(step=i, topic="ws-test", member=i % 2, reward=float(i))
            return i

        assert client.gather(client.map(report_on_worker, range(4))) == list(range(4))
    finally:
        client.close()

    def received() -> bool:
        r = api("GET", "clusters/panel-t/metrics/ws-test")
        return r.status_code == 200 and r.json()["received"] == 4

    wait_for(received, 30, message="4 reports at the server")
    url = server.api("events").replace("http://", "ws://")
    ws = websocket.create_connection(url, header=[f"Authorization: token {server.token}"], timeout=20)
    try:
        seen: dict[str, dict] = {}

        def receive_until(kind: str, pred=lambda m: True, timeout: float = 15):
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                msg = json.loads(ws.recv())
                seen[msg["type"]] = msg
                if msg["type"] == kind and pred(msg):
                    return msg
            pytest.fail(f"no {kind!r} message within {timeout} s (saw {sorted(seen)})")

        clusters = receive_until("clusters")
        assert "panel-t" in [c["name"] for c in clusters["clusters"]]
        ws.send(json.dumps({"type": "interval", "ms": 200}))
        ws.send(json.dumps({"type": "watch", "cluster": "panel-t", "topics": ["ws-test"]}))
        model = receive_until("cluster")["model"]
        assert model["name"] == "panel-t" and model["workers"]
        metrics = receive_until("metrics", lambda m: m["topic"] == "ws-test")
        assert metrics["data"]["scalars"]["reward"]
        assert metrics["data"]["scalars"]["reward"]["member=1"] == [[1, 1.0], [3, 3.0]]  # the reports made above
        # New reports are pushed without asking.
        client = _client("panel-t")
        try:
            client.submit(
                lambda: __import__("jupyter_cluster").report(step=99, topic="ws-test", member=0, reward=-1.0)
            ).result()
        finally:
            client.close()
        pushed = receive_until("metrics", lambda m: [99, -1.0] in m["data"]["scalars"]["reward"].get("member=0", []))
        assert pushed["cluster"] == "panel-t"
        ws.send(json.dumps({"type": "nonsense"}))
        assert "unknown message type" in receive_until("error")["message"]
        # every envelope the server pushed has exactly the fields of its type (wire/envelopes.py)
        assert {"clusters", "jobs", "cluster", "topics", "metrics", "error"} <= set(seen), sorted(seen)
        for msg in seen.values():
            check_envelope(msg)
    finally:
        ws.close()


def test_websocket_pushes_a_run_when_it_is_added_and_when_it_ends(server, panel_cluster):
    """The panel and the sweep view hear of runs from the events socket, without polling GET runs."""
    import websocket

    from jupyter_cluster import telemetry

    url = server.api("events").replace("http://", "ws://")
    ws = websocket.create_connection(url, header=[f"Authorization: token {server.token}"], timeout=20)
    client = _client("panel-t")
    try:

        def receive_run(event: str, run: str, timeout: float = 20) -> dict:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                msg = json.loads(ws.recv())
                if msg["type"] == "run" and msg["event"] == event and msg["run"]["run"] == run:
                    return msg["run"]
                assert not (msg["type"] == "run" and msg["run"]["run"] == run), msg  # no other event for it
            pytest.fail(f"no run {event!r} message for {run} within {timeout} s")

        receive_until_jobs = json.loads(ws.recv())  # the socket's first look: what is there is not news
        assert receive_until_jobs["type"] in ("clusters", "jobs")
        now = time.time()
        job = dict(_job("ws-job", now, cluster="panel-t"), run="ws-run", kind="map", notebook="ws.ipynb")
        client.log_event(telemetry.JOBS_TOPIC, job)
        added = receive_run("added", "ws-run")
        assert (added["state"], added["notebook"], added["cluster"]) == ("running", "ws.ipynb", "panel-t")
        client.log_event(telemetry.JOBS_TOPIC, dict(job, done=1, state="finished", updated=time.time()))
        finished = receive_run("finished", "ws-run")
        assert finished["state"] == "finished" and finished["done"] == 1
    finally:
        client.close()
        ws.close()


def test_stop_of_a_panel_cluster_from_a_kernel(api, panel_cluster):
    """``%cluster stop NAME`` in a kernel that does not hold it asks the panel's host process."""
    import jupyter_cluster as jc
    from jupyter_cluster.state import registry

    owner = registry.read("panel-t").owner_pid
    assert jc.stop("panel-t") == "panel-t"
    assert registry.read("panel-t") is None
    wait_for(lambda: "panel-t" not in api.names(), 5, message="panel-t to leave the list")
    wait_for(lambda: not _alive(owner), 30, message="the host process to exit")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by the server) counts as gone
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def test_a_kernel_cannot_stop_another_kernels_cluster():
    import jupyter_cluster as jc

    proc = start_kernel_like("proc-c")
    try:
        with pytest.raises(jc.ClusterError, match="belongs to another kernel"):
            jc.stop("proc-c")
    finally:
        proc.kill()
        proc.wait(10)


# -- reconnection: a scheduler restarted at the same address is followed again ------------
def _scheduler(port: int) -> subprocess.Popen:
    code = textwrap.dedent(
        f"""
        import asyncio
        from distributed import Scheduler

        async def main():
            async with Scheduler(host="127.0.0.1", port={port}, dashboard=False) as s:
                print("up", flush=True)
                await s.finished()

        asyncio.run(main())
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout.readline().strip() == "up"
    return proc


def test_server_follows_a_restarted_scheduler(api):
    from jupyter_cluster import telemetry
    from jupyter_cluster.state import registry

    from ..jupyter_process import free_port

    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    first = _scheduler(port)
    record = registry.ClusterRecord(name="restarts", backend="address", address=address, owner_kind="process")
    registry.write(record)
    second = None
    try:

        def publish(job: str) -> None:
            client = _client("restarts")
            try:
                now = time.time()
                client.log_event(telemetry.JOBS_TOPIC, _job(job, now))
            finally:
                client.close()

        def status() -> str:
            return next(c for c in api.ok("GET", "clusters")["clusters"] if c["name"] == "restarts")["status"]

        def job_ids() -> set[str]:
            return {j["job"] for j in api.ok("GET", "jobs?cluster=restarts")["running"]}

        wait_for(lambda: "restarts" in api.names(), 5, message="the record in the list")
        # Publish once the server's client is connected and subscribed, as a real job's
        # repeated progress messages would find it; the listing alone comes from the registry.
        wait_for(lambda: status() == "running", 15, message="the server to connect")
        publish("before")
        wait_for(lambda: "before" in job_ids(), 15, message="job 'before'")
        first.kill()
        first.wait(10)
        wait_for(lambda: status() != "running", 15, message="the server to notice")
        second = _scheduler(port)
        wait_for(lambda: status() == "running", 30, message="reconnection")
        publish("after")
        wait_for(lambda: {"before", "after"} <= job_ids(), 15, message="job 'after' from the new scheduler")
    finally:
        registry.remove("restarts")
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(10)


# -- the jobs store (pure data) -------------------------------------------------------------
def test_jobs_store_keeps_latest_state_and_recent_history():
    from jupyter_cluster.server.jobs import JobsStore

    me = os.getpid()

    def msg(job, state="running", done=0, updated=1.0, kernel=me, **kw):
        return {
            "job": job,
            "label": job,
            "kernel": kernel,
            "total": 10,
            "done": done,
            "failed": 0,
            "state": state,
            "started": 1.0,
            "updated": updated,
            **kw,
        }

    one = JobsStore()
    one.add(msg("x", state="finished", done=10, updated=10.0))
    store = JobsStore(owner_bytes=2 * one.nbytes + 10)  # room for 2 finished jobs of this kernel
    assert store.add(msg("a", done=3, updated=2.0))
    assert store.add(msg("a", done=1, updated=1.5))  # a late backlog duplicate does not go back
    assert store.jobs["a"]["done"] == 3
    for i, job in enumerate("bcd"):
        store.add(msg(job, state="finished", done=10, updated=10.0 + i))
    snap = store.snapshot()
    assert [j["job"] for j in snap["running"]] == ["a"]
    assert [j["job"] for j in snap["recent"]] == ["d", "c"]  # newest first, only 2 kept
    for bad in [None, {"label": "no id"}, msg("e", done="3"), msg("f", failed=True)]:
        assert not store.add(bad)
    store.add(msg("g", kernel=2**22 + 12345))  # a kernel pid that does not exist
    store.mark_lost(lambda pid: pid == os.getpid())
    assert store.jobs["g"]["state"] == "lost" and store.jobs["a"]["state"] == "running"


def test_a_cluster_adapted_by_its_owner_shows_as_adaptive(api):
    """``%cluster adapt``, ``jc.adapt`` and a handle's ``.adapt`` draw the card apart, as the panel's Adapt does."""
    import jupyter_cluster as jc

    handle = jc.start(name="own-adapt", workers=1, threads=1, processes=False)
    try:

        def listed() -> dict[str, Any]:
            return {c["name"]: c for c in api.ok("GET", "clusters")["clusters"]}.get("own-adapt") or {}

        wait_for(lambda: listed().get("status") == "running", 60, interval=0.2, message="own-adapt listed")
        assert "adaptive" not in listed()
        handle.adapt(0, 3)
        wait_for(lambda: listed().get("adaptive") == {"minimum": 0, "maximum": 3}, 30, interval=0.2, message="adaptive")
        handle.adapt(1)  # no maximum: the bounds it adapts between, as Dask was given them
        wait_for(lambda: listed().get("adaptive") == {"minimum": 1, "maximum": 4}, 30, interval=0.2, message="1-4")
        assert api.ok("POST", "clusters/own-adapt/scale", json={"workers": 1})["workers"] == 1
        assert "adaptive" not in listed()  # the panel's Scale, newer than the owner's adapt: a fixed size
        handle.adapt(0, 2)
        wait_for(lambda: listed().get("adaptive") == {"minimum": 0, "maximum": 2}, 30, interval=0.2, message="0-2")
    finally:
        handle.close()


@pytest.mark.parametrize("path", ["config", "detached", "clusters"])
def test_jupyterlabs_cache_buster_is_no_unknown_query_argument(api, path):
    """JupyterLab 4.6 adds ``?<milliseconds>`` to GET requests: refused, the New dialog had no backends."""
    r = api("GET", f"{path}?1796438749352")
    assert r.status_code == 200, (path, r.status_code, r.text)
    r = api("GET", f"{path}?1796438749352=x")  # a value: not the cache buster, an unknown argument
    assert r.status_code == 400 and "unknown query argument" in r.json()["message"], (path, r.text)
