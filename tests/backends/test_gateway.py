"""The gateway backend against a real dask-gateway-server (local backend, password auth) started here.

Start a gateway cluster from a real IPython shell, run a ``%%parallel`` cell on
it, see it in ``%cluster list``, attach to it by name from a second, real
kernel (by this machine's registry name and by the gateway's own name), scale
and adapt it, stop it (the gateway then has no cluster); a wrong password is
refused in one sentence before any cluster is asked for.
"""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError

from tests.conftest import wait_for
from tests.helpers import kernel_ok, start_jupyter_named_kernel, stop_jupyter_named_kernel

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    from tests.hpc.gateway_server import running_gateway

    with running_gateway(tmp_path_factory.mktemp("gateway")) as server:
        yield server


def _gateway_names() -> set[str]:
    from jupyter_cluster.backends.gateway import list_clusters

    return {c["name"] for c in list_clusters() if c["status"] in ("pending", "running")}


def test_start_list_connect_scale_stop(ip, gateway, tmp_path, capsys):
    import jupyter_cluster as jc

    before = _gateway_names()
    ip.run_line_magic("cluster", "start --backend gateway --name gw-a")
    handle = jc.cluster.session.get("gw-a")
    km = kc = None
    try:
        assert handle.address.startswith("gateway://127.0.0.1:")
        gateway_name = handle.extra["gateway"]["cluster"]
        assert _gateway_names() - before == {gateway_name}
        ip.run_cell_magic("parallel", "i in range(8) --out gw_results --no-progress", "i * 3")
        assert ip.user_ns["gw_results"] == [i * 3 for i in range(8)]

        capsys.readouterr()
        ip.run_line_magic("cluster", "list")
        listed = capsys.readouterr().out
        assert "gw-a" in listed and f"dask-gateway at {gateway.address}: 1 cluster(s)" in listed, listed
        assert any(line.split()[:2] == [gateway_name, "running"] for line in listed.splitlines()), listed

        # a second kernel attaches by this machine's name and by the gateway's own
        km, kc, _ = start_jupyter_named_kernel(tmp_path)
        settings = gateway.dask_config()
        kernel_ok(kc, f"import dask, dask_gateway; dask.config.set({settings!r})\n%load_ext jupyter_cluster")
        out = kernel_ok(kc, "%cluster connect gw-a\nimport jupyter_cluster as jc\nprint(jc.map(abs, [-1, -2, -3]))")
        assert "[1, 2, 3]" in out, out
        out = kernel_ok(
            kc, f"%cluster connect {gateway_name}\nprint(jc.map(abs, [-4], client=jc.cluster.session.get()))"
        )
        assert "[4]" in out, out

        ip.run_line_magic("cluster", "scale 2")
        handle.wait_for_workers(2, timeout=120)
        ip.run_line_magic("cluster", "adapt --minimum 1 --maximum 2")
        assert jc.map(abs, [-5, -6], client=handle) == [5, 6]
    finally:
        if kc is not None:
            stop_jupyter_named_kernel(km, kc)
        if not handle.closed:
            ip.run_line_magic("cluster", "stop gw-a")
    wait_for(lambda: gateway_name not in _gateway_names(), 60, message="the gateway to stop the cluster")


def test_killed_kernels_gateway_cluster_is_stopped_by_registry_cleanup(gateway, tmp_path):
    import os
    import signal

    from jupyter_cluster.state import registry

    km, kc, _ = start_jupyter_named_kernel(tmp_path)
    try:
        settings = gateway.dask_config()
        out = kernel_ok(
            kc,
            f"import dask, dask_gateway; dask.config.set({settings!r})\n%load_ext jupyter_cluster\n"
            "%cluster start --backend gateway --name gw-kill9 --workers 0 --adapt-max 1\n"
            "import jupyter_cluster as jc; print('GW', jc.cluster.session.get().extra['gateway']['cluster'])",
            timeout=180,
        )
        gateway_name = out.split("GW ")[1].split()[0]
        assert gateway_name in _gateway_names()
        os.kill(km.provisioner.process.pid, signal.SIGKILL)
        # any process that reads the registry (the panel's server, %cluster list) drops the dead record
        wait_for(
            lambda: (
                "gw-kill9" not in {r.name for r in registry.live_records()} and gateway_name not in _gateway_names()
            ),
            90,
            message="the dead kernel's gateway cluster to be stopped",
        )
    finally:
        stop_jupyter_named_kernel(km, kc)


def test_wrong_password_refused_in_one_sentence(ip, gateway):
    import dask

    before = _gateway_names()
    with dask.config.set(gateway.dask_config(password="not-the-password")), pytest.raises(UsageError) as info:
        ip.run_line_magic("cluster", "start --backend gateway")
    message = str(info.value)
    assert "refused the login of alice" in message, message
    assert "\n" not in message and message.endswith(".") and message.count(". ") == 0, message
    assert _gateway_names() == before


def _basic_auth(address: str) -> dict:
    return {
        "gateway.address": address,
        "gateway.auth.type": "basic",
        "gateway.auth.kwargs": {"username": "alice", "password": "a-secret"},
    }


def test_password_over_plain_http_to_another_host_is_refused_before_connecting(ip):
    pytest.importorskip("dask_gateway")
    import dask

    # 192.0.2.1 is TEST-NET-1 (never routed): were it contacted, the error would be "no dask-gateway answered"
    with dask.config.set(_basic_auth("http://192.0.2.1:8000")), pytest.raises(UsageError) as info:
        ip.run_line_magic("cluster", "start --backend gateway")
    message = str(info.value)
    assert "plain http:// to another machine" in message and "a-secret" not in message, message
    assert "https://" in message and "jupyter-cluster.gateway.allow-http-password: true" in message, message
    assert "\n" not in message and message.endswith(".") and message.count(". ") == 0, message


@pytest.mark.parametrize(
    ("address", "settings"),
    [
        ("https://192.0.2.1:8000", {}),  # encrypted
        ("http://127.0.0.1:8000", {}),  # loopback never leaves this machine
        ("http://localhost:8000", {}),
        ("http://[::1]:8000", {}),
        ("http://192.0.2.1:8000", {"jupyter-cluster.gateway.allow-http-password": True}),  # the opt-in
        ("http://192.0.2.1:8000", {"gateway.auth.kwargs": {"username": "alice"}}),  # no password to leak
    ],
)
def test_password_transport_allowed(address, settings):
    pytest.importorskip("dask_gateway")
    import dask

    from jupyter_cluster.backends.gateway import _close, _gateway

    with dask.config.set({**_basic_auth(address), **settings}):
        gateway = _gateway(None)  # nothing is sent until a request
    try:
        assert gateway.address == address
    finally:
        _close(gateway)
