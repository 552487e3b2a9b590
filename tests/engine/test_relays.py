"""Relays: a round of batches reaching many workers travels as one message per group of workers.

Real clusters: the module's own 2-worker local cluster (TLS by default) with
``allowed-failures: 1``, and ``engine.relay-min-workers`` lowered so that two
workers are "many" (the first worker relays the second's batches); worker
processes killed with SIGKILL mid-map.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
import time

import cloudpickle
import dask
import distributed  # noqa: F401  (its config defaults must exist before dask.config.set below)
import pytest

from jupyter_cluster import mapping
from jupyter_cluster.engine import cluster as engine_cluster
from jupyter_cluster.engine import direct as engine_direct
from jupyter_cluster.engine import protocol as engine_protocol

from ..conftest import wait_for
from ..helpers import gated_square

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def where(x):
    time.sleep(0.01)
    return (x, os.getpid())


# the module's cluster (tests/conftest.py): Dask gives up on a task after 2 worker deaths instead of 4
pytestmark = pytest.mark.cluster_config({"distributed.scheduler.allowed-failures": 1})


@pytest.fixture
def relays_always():
    # Every round of batches goes through a relay, even one reaching a single worker.
    with dask.config.set({"jupyter-cluster.engine.relay-min-workers": 1}):
        yield


def worker_pids(client) -> dict[str, int]:
    return client.run(os.getpid)


def test_relayed_batches_come_back_once_in_order_from_every_worker(cluster, relays_always):
    out = mapping.map(where, range(400), client=cluster, progress=False)
    job = mapping.last_job()
    assert [x for x, _ in out] == list(range(400))
    assert job.path == "direct" and job.relays > 0
    # Both workers ran items: the relay forwarded the other worker's batches (over TLS on a TLS cluster).
    assert len({pid for _, pid in out}) == 2
    assert len(job.workers_used) == 2
    if cluster.address.startswith("tls://"):
        assert all(w.startswith("tls://") for w in job.workers_used)


def test_without_enough_workers_a_round_goes_straight_to_its_leases(cluster):
    with dask.config.set({"jupyter-cluster.engine.relay-min-workers": 3}):
        out = mapping.map(where, range(50), client=cluster, progress=False)
    assert [x for x, _ in out] == list(range(50))
    assert mapping.last_job().relays == 0


def test_a_relay_forwards_a_batch_only_with_the_secret_of_the_map_that_placed_the_lease(cluster, relays_always):
    client = cluster.client
    assert mapping.map(where, range(20), client=cluster, progress=False)[0][0] == 0
    pool = engine_direct.pool_for(client)
    with pool.lock:
        idle = [ls for leases in pool.idle.values() for ls in leases if not ls.dead]
    assert idle, "the map's leases should linger in the client's pool"
    lease = idle[0]
    relay = sorted(engine_cluster.workers_now(client))[0]
    token = "relay-test"
    run = engine_protocol.MapRun(token, cloudpickle.dumps(abs), False, retries=0, timeout=None, capture=False)

    async def relay_once(secret, packed):
        entries = [engine_protocol.RelayEntry(lease.addr, lease.id, secret, run, engine_protocol.pack([-3, -4]), None)]
        # As the client sends a group (one pickle), and as a plain list, which a relay also takes.
        sent = engine_protocol.pack_group(entries) if packed else entries
        answer = await engine_cluster.call(client, relay, "jc_relay", entries=sent)
        # Small results: the relay answers with one pickle of all its answers.
        assert isinstance(answer["answers"], bytes)
        return engine_protocol.unpack_answers(answer["answers"])[0]

    for packed in (True, False):
        refused = client.sync(relay_once, "0" * 32, packed)
        assert refused == {"status": "refused"}
        accepted = client.sync(relay_once, pool.secret, packed)
        # The result comes back pickled as the member sent it: the relay did not unpickle it.
        assert accepted["status"] == "ok" and isinstance(accepted["result"], bytes)
        assert engine_protocol.unpack(accepted["result"])[0] == [3, 4]


def test_a_relayed_map_survives_sigkilled_relays_and_members(cluster, relays_always, tmp_path):
    client = cluster.client
    flag = str(tmp_path / "kills-done")
    items = list(range(150))
    job = mapping.MapJob(functools.partial(gated_square, flag), (items,), chunksize=3, client=cluster, progress=False)
    values: list = []
    driver = threading.Thread(target=lambda: values.extend(job), daemon=True)  # the map runs while workers die
    driver.start()
    wait_for(lambda: job.done >= 3, timeout=60, message="the map to get going")
    # The sorted first worker relays the batches of both; kill it, then the other, then the first again.
    for kill in range(3):
        victim = sorted(worker_pids(client).items())[kill % 2][1]
        os.kill(victim, signal.SIGKILL)

        def replaced(victim=victim):
            try:
                pids = set(worker_pids(client).values())
            except Exception:  # a worker is mid-restart
                return False
            return len(pids) >= 2 and victim not in pids

        wait_for(replaced, timeout=90, interval=0.1, message="the nanny to replace the killed worker")
        assert not job.finished
    open(flag, "w").close()
    driver.join(timeout=120)
    assert not driver.is_alive()
    # every result exactly once, in input order
    assert values == [x * x for x in items]
    assert job.relays > 0


@pytest.mark.parametrize("relay_min", [1, 0], ids=["relayed", "direct"])
def test_a_batch_whose_items_cannot_be_pickled_fails_alone(cluster, relay_min):
    # The client pickles each batch's items itself (relayed or not): a lock in one batch fails that
    # batch's items as data, and the map goes on with the others.
    items: list = list(range(10))
    items[5] = threading.Lock()
    with dask.config.set({"jupyter-cluster.engine.relay-min-workers": relay_min}):
        out = mapping.map(where, items, chunksize=2, errors="collect", client=cluster, progress=False)
    job = mapping.last_job()
    assert job.path == "direct" and (job.relays > 0) == (relay_min == 1)
    assert sorted(job.errors) == [4, 5]  # the lock's batch, as a whole
    assert all(isinstance(out[i], TypeError) for i in (4, 5))
    assert [out[i][0] for i in range(10) if i not in (4, 5)] == [0, 1, 2, 3, 6, 7, 8, 9]


def tail_of(blob):
    time.sleep(0.005)
    return blob if len(blob) > 1000 else blob[-3:]


def test_relayed_items_and_results_too_big_to_inline_travel_as_frames(cluster, relays_always):
    # A group whose items include one over INLINE_BYTES goes as the plain list (the big item as
    # Dask frames), and so do the answers when a result is that big; small ones travel in one msgpack.
    big = b"b" * (engine_protocol.INLINE_BYTES + 10)
    items = [b"%03d" % k for k in range(12)]
    items[7] = big
    out = mapping.map(tail_of, items, chunksize=1, client=cluster, progress=False)
    job = mapping.last_job()
    assert job.path == "direct" and job.relays > 0
    assert out[7] == big
    assert [out[k] for k in range(12) if k != 7] == [b"%03d" % k for k in range(12) if k != 7]
    assert len(job.workers_used) == 2
    # pack_group keeps the list only when some items are not bytes
    run = engine_protocol.MapRun("t", None, False, retries=0, timeout=None, capture=True)
    small = [engine_protocol.RelayEntry("tcp://a:1", "L", "s", run, engine_protocol.pack([1]), None)]
    assert isinstance(engine_protocol.pack_group(small), bytes)
    mixed = small + [engine_protocol.RelayEntry("tcp://a:2", "M", "s", run, engine_protocol.pack([big]), None)]
    assert engine_protocol.pack_group(mixed) is mixed


class _DefinedInMain:
    def __init__(self, v):
        self.v = v


def test_pack_uses_plain_pickle_and_falls_back_where_dask_would():
    # Test modules register themselves by value (this one, and others run before it in the same
    # process); pack's fast path needs none registered: unregister them all here, and restore after.
    registered = [sys.modules[name] for name in cloudpickle.list_registry_pickle_by_value() if name in sys.modules]
    for module in registered:
        cloudpickle.unregister_pickle_by_value(module)
    main = sys.modules["__main__"]
    cls = type("_JcPackProbe", (_DefinedInMain,), {"__module__": "__main__"})
    main._JcPackProbe = cls  # type: ignore[attr-defined]
    try:
        assert not cloudpickle.list_registry_pickle_by_value()
        blob = engine_protocol.pack([1, 2.5, "x"])
        assert isinstance(blob, bytes) and engine_protocol.unpack(blob) == [1, 2.5, "x"]
        # Plain pickle cannot take a lambda: cloudpickle does, as Dask's dumps would.
        assert engine_protocol.unpack(engine_protocol.pack([lambda x: x + 1]))[0](1) == 2
        # A class of __main__ (a notebook's) goes by value, so a worker without it can load it.
        blob = engine_protocol.pack([cls(5)])
        delattr(main, "_JcPackProbe")
        assert engine_protocol.unpack(blob)[0].v == 5
    finally:
        if hasattr(main, "_JcPackProbe"):
            delattr(main, "_JcPackProbe")
        for module in registered:
            cloudpickle.register_pickle_by_value(module)
