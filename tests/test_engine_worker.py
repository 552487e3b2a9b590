"""engine.worker: what runs on a worker process imports nothing of the notebook side; its leases' answers."""

from __future__ import annotations

import sys

import cloudpickle

from jupyter_cluster import mapping
from jupyter_cluster.engine import cluster as engine_cluster
from jupyter_cluster.engine import direct as engine_direct
from jupyter_cluster.engine import protocol as engine_protocol

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
    options = {"retries": 0, "timeout": None, "capture": False}

    async def batch(blob):
        run = engine_protocol.Run("never-sent-" + lease.id, blob, False, options)
        return await engine_cluster.call(
            client, lease.addr, engine_protocol.Op.BATCH, lease=lease.id, secret=pool.secret,
            run=run, items=engine_protocol.pack([-3, -4]), budget=None,
        )  # fmt: skip

    missing = client.sync(batch, None)
    assert engine_protocol.Status.of(missing) is engine_protocol.Status.NEED_FN
    sent = client.sync(batch, cloudpickle.dumps(abs))
    assert engine_protocol.Status.of(sent) is engine_protocol.Status.OK
    assert engine_protocol.unpack(sent["result"])[0] == [3, 4]


def test_worker_processes_import_only_what_runs_on_them(cluster):
    """Issue 13 start-up: no notebook side (sessions, widgets, telemetry hub, IPython) in a worker process."""
    # Fresh worker processes: earlier tests' functions can make a worker import
    # this test module (found on the workers' path), which imports the map front.
    cluster.client.restart()
    mods = mapping.map(loaded_modules, [0], client=cluster, progress=False)[0]
    assert __name__ not in mods
    assert "jupyter_cluster.engine.worker" in mods
    notebook_side = [m for m in mods if m.split(".")[0] in ("IPython", "ipywidgets", "anywidget")
                     or m in ("jupyter_cluster.session", "jupyter_cluster.mapping", "jupyter_cluster.engine.job",
                              "jupyter_cluster.widgets", "jupyter_cluster.telemetry.progress", "jupyter_cluster.magics")]  # fmt: skip
    assert not notebook_side, f"worker processes imported {notebook_side}"
