"""TLS clusters (``%cluster start --tls``): outsiders are refused, we keep working.

One TLS cluster for the module.  Clients without its credentials (none, plain
TCP, someone else's certificate) cannot get in; the owning kernel, another
process of the same user attaching by name, the map engine, ``Pool`` and
telemetry all work over it.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time

import pytest

import jupyter_cluster as jc
from jupyter_cluster.backends import local
from jupyter_cluster.state import credentials


@pytest.fixture(scope="module")
def tls_cluster():
    handle = jc.start(workers=2, threads=1, tls=True, name="tls-test")
    yield handle
    if not handle.closed:
        handle.close()


def test_tls_cluster_works_for_its_owner(tls_cluster):
    assert tls_cluster.address.startswith("tls://127.0.0.1:")
    assert tls_cluster.security is not None and tls_cluster.security.require_encryption
    assert tls_cluster.client.submit(sum, [1, 2, 3]).result() == 6
    assert tls_cluster.model()["n_workers"] == 2


async def _identity(address, security):
    import asyncio

    from distributed.comm import connect

    args = security.get_connection_args("client") if security is not None else {}
    comm = await connect(address, timeout=2, **args)
    try:
        await comm.write({"op": "identity"})
        return await asyncio.wait_for(comm.read(), 2)
    finally:
        comm.abort()


def _refused(address, security=None) -> bool:
    """Whether the scheduler at ``address`` refuses a client holding ``security``."""
    import asyncio

    try:
        reply = asyncio.run(_identity(address, security))
    except (OSError, TimeoutError, asyncio.TimeoutError, TypeError):
        # OSError covers failed handshakes and closed comms; TypeError is a
        # client with no TLS settings at all, which cannot even try.
        return True
    assert reply.get("type") == "Scheduler"
    return False


def test_clients_without_the_credentials_are_refused(tls_cluster):
    from distributed.security import Security

    t0 = time.monotonic()
    assert not _refused(tls_cluster.address, tls_cluster.security)  # the real credentials get in
    assert _refused(tls_cluster.address)  # no TLS settings at all
    assert _refused(tls_cluster.address.replace("tls://", "tcp://"))  # plain TCP
    # Trusting the cluster's CA but presenting no certificate of our own: Dask requires mutual TLS.
    assert _refused(
        tls_cluster.address, Security(tls_ca_file=tls_cluster.security.tls_ca_file, require_encryption=True)
    )
    assert _refused(tls_cluster.address, Security.temporary())  # a certificate the cluster does not trust
    assert time.monotonic() - t0 < 30
    # And through the notebook API: one sentence, no traceback.
    with pytest.raises(jc.ClusterError, match="did not answer|no scheduler answered"):
        jc.connect(tls_cluster.address.replace("tls://", "tcp://"))


def test_credentials_are_private_and_let_the_same_user_attach(tls_cluster, tmp_path):
    path = credentials.credentials_path(tls_cluster.name)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    # Another process (another kernel, the Jupyter server) attaches by name.
    code = (
        "import jupyter_cluster as jc\n"
        f"h = jc.connect({tls_cluster.name!r})\n"
        "print('RESULT', h.client.submit(pow, 2, 10).result(), h.address.split(':')[0])\n"
        "h.close()\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=90, env=os.environ.copy()
    )
    assert "RESULT 1024 tls" in out.stdout, out.stdout + out.stderr[-2000:]


def test_tls_default_follows_the_bind_address():
    assert local.wants_tls("auto", "127.0.0.1") is False
    assert local.wants_tls("auto", "localhost") is False
    assert local.wants_tls("auto", "10.123.0.1") is True
    assert local.wants_tls("auto", "0.0.0.0") is True
    assert local.wants_tls(False, "10.123.0.1") is False
    assert local.wants_tls(True, "127.0.0.1") is True


def _square(x):
    return x * x


def test_map_engine_pool_and_telemetry_over_tls(tls_cluster):
    """The front ends other modules provide keep working over TLS."""
    jc.cluster.session.connect(tls_cluster.name)  # make it current
    from jupyter_cluster import mapping

    assert mapping.map(_square, range(20), client=tls_cluster.client, progress=False) == [i * i for i in range(20)]

    try:
        from jupyter_cluster.pool import Pool
    except ImportError:
        Pool = None
    if Pool is not None:
        with Pool() as pool:
            assert pool.map(_square, range(10)) == [i * i for i in range(10)]

    try:
        from jupyter_cluster import telemetry
    except ImportError:
        telemetry = None
    if telemetry is not None and hasattr(telemetry, "report"):
        received = []
        client = tls_cluster.client
        topic = telemetry.topic_name("tls-check")
        # Through follow(), as the kernel and the server subscribe: a bare
        # subscribe_topic() travels on the client's batched stream, unconfirmed, and
        # under load the scheduler could get the map's reports first and never
        # forward them (reproduced: 11 of 30 maps lost every report, load ~6).
        client.sync(telemetry.follow, client, topic, lambda dask_topic, msg: received.append(msg))

        def work(i):
            from jupyter_cluster import report

            report(step=i, topic="tls-check", value=float(i))
            return i

        assert mapping.map(work, range(5), client=client, progress=False) == list(range(5))

        # Reports are batched per worker process, so count records, not telemetry.
        def records():
            return sorted(r["step"] for msg in received for r in msg["records"])

        deadline = time.monotonic() + 20
        while len(records()) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        client.unsubscribe_topic(topic)
        assert records() == [0, 1, 2, 3, 4], received


def test_parallel_cell_over_tls(ip, tls_cluster):
    jc.cluster.session.connect(tls_cluster.name)
    ip.run_cell_magic("parallel", "x in range(6) --out tls_squares", "x * x\n")
    assert ip.user_ns["tls_squares"] == [x * x for x in range(6)]


def test_the_panel_reaches_the_tls_cluster(tls_cluster):
    """The Jupyter server's manager (a separate client) attaches with the saved credentials."""
    import asyncio

    from jupyter_cluster.server.manager import Connection
    from jupyter_cluster.state import registry

    async def reach():
        conn = Connection(registry.read(tls_cluster.name))
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                await conn.tick()
                if conn.status == "running" and conn.totals["n_workers"] == 2:
                    break
                await asyncio.sleep(0.1)
            return conn.summary(), await conn.model()
        finally:
            await conn.close()

    summary, model = asyncio.run(reach())
    assert summary["status"] == "running" and summary["error"] is None, summary
    assert model["n_workers"] == 2 and model["address"].startswith("tls://")


def test_a_stopped_clusters_finaliser_leaves_a_newer_clusters_credentials():
    """A stopped cluster's credentials finaliser runs whenever the garbage collector gets to its
    LocalCluster; by then a newer cluster may have taken the name, and its key must stay (seen: a
    %%spmd cluster's nanny could not restart a killed worker, its CA file was gone)."""
    import gc
    import weakref

    first = jc.start(workers=1, threads=1, tls=True, name="tls-reused")
    old = weakref.ref(first.cluster)
    first.close()
    second = jc.start(workers=1, threads=1, tls=True, name="tls-reused")
    try:
        # Dask keeps closed clusters in cycles, so only the collector ends the first one here.
        del first
        for _ in range(20):
            gc.collect()
            if old() is None:
                break
            time.sleep(0.1)
        assert old() is None, "the first cluster was never collected: the test proves nothing"
        assert os.path.exists(credentials.pem_path("tls-reused"))
        assert second.client.submit(sum, [1, 2]).result() == 3
        second.cluster.scale(2)  # a new worker reads the CA file: the nanny fails if it was deleted
        deadline = time.monotonic() + 60
        while len(second.client.scheduler_info(n_workers=-1)["workers"]) < 2:
            assert time.monotonic() < deadline, "the second worker never joined"
            time.sleep(0.2)
    finally:
        second.close()
    assert not os.path.exists(credentials.pem_path("tls-reused"))
