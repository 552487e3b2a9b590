"""engine.worker: what runs on a worker process imports nothing of the notebook side; its leases' answers."""

from __future__ import annotations

import os
import sys

import cloudpickle
import pytest

from jupyter_cluster import mapping
from jupyter_cluster.engine import cluster as engine_cluster
from jupyter_cluster.engine import direct as engine_direct
from jupyter_cluster.engine import protocol as engine_protocol
from jupyter_cluster.engine import worker as engine_worker

from ..conftest import wait_for

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def loaded_modules(x):
    return sorted(
        m for m in sys.modules if m.startswith(("jupyter_cluster", "IPython", "ipywidgets", "anywidget", "tests"))
    )


def test_a_lease_asks_again_for_a_function_its_process_does_not_have(cluster):
    """A batch whose ``Run`` carries no function (the client thinks the worker has it) comes back
    ``need-fn`` without running; the same batch with the function runs (engine.worker.lease)."""
    client = cluster.client
    # First in this module: the next test restarts the workers, which may race the start's warm-up.
    assert mapping.map(abs, [-1, -2], client=cluster, progress=False) == [1, 2]
    assert mapping.last_job().path == "direct"
    pool = engine_direct.pool_for(client)
    with pool.lock:
        idle = [ls for leases in pool.idle.values() for ls in leases if not ls.dead and ls.ready]
    assert idle, "the map's leases should linger in the client's pool"
    lease = idle[0]

    async def batch(blob):
        run = engine_protocol.MapRun("never-sent-" + lease.id, blob, False, retries=0, timeout=None, capture=False)
        return await engine_cluster.call(
            client, lease.addr, engine_protocol.Op.BATCH, lease=lease.id, secret=pool.secret,
            run=run, items=engine_protocol.pack([-3, -4]), budget=None,
        )  # fmt: skip

    missing = client.sync(batch, None)
    assert engine_protocol.Status.of(missing) is engine_protocol.Status.NEED_FN
    sent = client.sync(batch, cloudpickle.dumps(abs))
    assert engine_protocol.Status.of(sent) is engine_protocol.Status.OK
    assert engine_protocol.unpack(sent["result"])[0] == [3, 4]


class OnlyHere:
    """An item that unpickles in this process only: on a worker it raises, as an item of a class
    the workers cannot import does."""

    def __init__(self, x):
        self.x = x

    def __reduce__(self):
        return (_rebuild, (self.x, os.getpid()))


def _rebuild(x, pid):
    if os.getpid() != pid:
        raise ImportError(f"item {x} cannot be loaded on this worker")
    return OnlyHere(x)


def value_of(item):
    return item.x


def kept_for(lease_id):
    from jupyter_cluster.engine.worker.registry import _REGISTRY

    with _REGISTRY.lock:
        return len(_REGISTRY.early.get(lease_id, []))


def test_a_batch_kept_for_a_lease_unpickles_there_and_fails_alone(cluster):
    """A batch sent before its lease starts is kept for it still packed, and unpickled by the lease
    once the secret matched; items the worker cannot unpickle fail that call with the worker's
    exception, the next batch runs, and the lease ends when told (not with an error)."""
    client = cluster.client
    engine_direct.release_leases(client)  # the new lease starts at once: no idle lease holds the thread
    wait_for(lambda: not any(client.processing().values()), message="the idle leases to end")
    addr = sorted(engine_cluster.workers_now(client))[0]
    lease_id, secret = f"jc-lease-keep-{os.getpid()}-0", "k" * 32

    async def early(fn, items):
        run = engine_protocol.MapRun(
            f"keep-{fn.__name__}", cloudpickle.dumps(fn), False, retries=0, timeout=None, capture=False
        )
        return await engine_cluster.call(
            client, addr, engine_protocol.Op.BATCH, lease=lease_id, secret=secret, run=run,
            items=engine_protocol.pack(items), budget=None, wait=60.0,
        )  # fmt: skip

    bad = engine_cluster.on_client_loop(client, early(value_of, [OnlyHere(1), OnlyHere(2)]))
    wait_for(lambda: client.run(kept_for, lease_id, workers=[addr])[addr] == 1, message="the batch to be kept")
    good = engine_cluster.on_client_loop(client, early(abs, [-3, -4]))
    wait_for(lambda: client.run(kept_for, lease_id, workers=[addr])[addr] == 2, message="the batch to be kept")
    placed = client.submit(engine_worker.lease, lease_id, secret, None, key=lease_id, workers=[addr], pure=False)
    with pytest.raises(ImportError, match="cannot be loaded on this worker"):
        bad.result(timeout=60)
    answer = good.result(timeout=60)
    assert engine_protocol.Status.of(answer) is engine_protocol.Status.OK
    assert engine_protocol.unpack(answer["result"])[0] == [3, 4]
    client.sync(engine_cluster.call, client, addr, engine_protocol.Op.CLOSE, lease=lease_id, secret=secret, wait=5.0)
    assert placed.result(timeout=60) == 1  # the lease ran the good batch and returned: it did not fail


def test_worker_processes_import_only_what_runs_on_them(cluster):
    """Issue 13 start-up: no notebook side (sessions, widgets, telemetry hub, IPython) in a worker process."""
    # Fresh worker processes: earlier tests' functions can make a worker import
    # this test module (found on the workers' path), which imports the map front.
    cluster.client.restart()
    mods = mapping.map(loaded_modules, [0], client=cluster, progress=False)[0]
    assert __name__ not in mods
    assert "jupyter_cluster.engine.worker" in mods
    notebook_side = [m for m in mods if m.split(".")[0] in ("IPython", "ipywidgets", "anywidget")
                     or m in ("jupyter_cluster.cluster.session", "jupyter_cluster.mapping", "jupyter_cluster.engine.job",
                              "jupyter_cluster.widgets", "jupyter_cluster.tracking.progress", "jupyter_cluster.magics")]  # fmt: skip
    assert not notebook_side, f"worker processes imported {notebook_side}"
