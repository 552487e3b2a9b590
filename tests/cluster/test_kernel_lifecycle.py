"""%cluster through real Jupyter kernels: a notebook run by nbclient, and kill -9 of a kernel."""

from __future__ import annotations

import json
import os
import signal
import time

import nbformat
import psutil
from jupyter_client import KernelManager
from nbclient import NotebookClient

from jupyter_cluster.state import registry

from ..conftest import wait_for
from ..helpers import cell_text, kernel_ok


def _notebook(*sources: str) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def test_cluster_magic_in_a_real_notebook(capfd):
    nb = _notebook(
        "%load_ext jupyter_cluster",
        "%cluster start --workers 2 --name nb-cluster",
        "import jupyter_cluster as jc\n"
        "h = jc.current()\n"
        "assert h.name == 'nb-cluster' and h.model()['n_workers'] == 2\n"
        "assert h.client.submit(sum, [1, 2, 3]).result() == 6",
        "%cluster list",
        "%cluster stop",
        "assert jc.current() is None",
    )
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    listing = "".join(o.get("text", "") for o in nb.cells[3].outputs)
    assert "nb-cluster" in listing and "kernel" in listing
    assert "Stopped cluster 'nb-cluster'" in "".join(o.get("text", "") for o in nb.cells[4].outputs)
    # Nothing noisy as the cluster stops: what the workers print reaches a notebook through the
    # kernel's stderr (under pytest ipykernel leaves that as is: it is this test's, captured here).
    shown = "\n".join(cell_text(cell) for cell in nb.cells) + capfd.readouterr().err
    assert "Traceback" not in shown and " - ERROR - " not in shown, shown


def _execute(kc, code: str, timeout: float = 120) -> str:
    """Run ``code`` in the kernel and return its stdout; fail on an error reply."""
    return kernel_ok(kc, code, timeout)


def _start_cluster(kc, name: str) -> list[int]:
    """``%cluster start`` a 2-worker cluster called ``name`` in the kernel; its workers' pids."""
    _execute(kc, f"%load_ext jupyter_cluster\n%cluster start --workers 2 --name {name}")
    out = _execute(
        kc,
        "import os, json, jupyter_cluster as jc\n"
        "print(json.dumps(sorted(jc.current().client.run(os.getpid).values())))",
    )
    return json.loads(out.strip().splitlines()[-1])


def test_kill_9_of_the_kernel_leaves_no_worker_and_no_live_record():
    km = KernelManager(kernel_name="python3")
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        worker_pids = _start_cluster(kc, "doomed")
        assert len(worker_pids) == 2 and all(psutil.pid_exists(p) for p in worker_pids)
        # the fork server the workers come from (backends.local.start_forkserver) must go too
        helpers = [psutil.Process(p).ppid() for p in worker_pids]
        assert all("forkserver" in " ".join(psutil.Process(p).cmdline()) for p in helpers)
        record = registry.read("doomed")
        assert record is not None
        sock = record.extra["dashboard_socket"]
        secrets = [os.path.join(registry.registry_dir(), f"doomed{suffix}") for suffix in (".pem", ".tls")]
        assert all(os.path.exists(p) for p in [sock, *secrets])

        kernel_pid = km.provisioner.process.pid
        os.kill(kernel_pid, signal.SIGKILL)

        def workers_gone():
            alive = []
            for pid in [*worker_pids, *helpers]:
                try:
                    if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                        alive.append(pid)
                except psutil.NoSuchProcess:
                    pass
            return not alive

        wait_for(
            workers_gone,
            timeout=30,
            message="worker processes and their fork server to exit after kill -9 of their kernel",
        )
        assert registry.read("doomed") is None
        assert "doomed" not in {r.name for r in registry.live_records()}
        # the dead owner's credentials and dashboard socket go with its record
        assert not any(os.path.exists(p) for p in secrets) and not os.path.exists(os.path.dirname(sock))
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_kill_9_of_a_kernel_mid_map_frees_its_leases_threads(tmp_path):
    """A kernel attached to a cluster it does not own is killed with ``kill -9`` in the middle of a
    ``%%parallel`` cell: its leases end and the workers' threads are free within seconds (no thread
    held for ``engine.linger`` or forever), and the cluster's owner carries on."""
    import jupyter_cluster as jc
    from jupyter_cluster.engine import direct as engine_dask

    from ..helpers import leases_on_workers, leases_running, start_jupyter_named_kernel, stop_jupyter_named_kernel

    owner = jc.start(workers=2, threads=1, name="k9-shared")
    client = owner.client
    km, kc, _ = start_jupyter_named_kernel(tmp_path)
    try:
        engine_dask.release_leases(client)
        wait_for(
            lambda: sum(map(len, leases_running(client).values())) == 0,
            timeout=15,
            message="the owner's warm-up to end",
        )
        _execute(kc, "%load_ext jupyter_cluster\n%cluster connect k9-shared")
        kc.execute("%%parallel x in range(100000) --out r\nimport time\ntime.sleep(0.1)\nx")
        wait_for(
            lambda: sum(map(len, leases_running(client).values())) == 2,
            timeout=60,
            message="the kernel's 2 leases to run",
        )
        os.kill(km.provisioner.process.pid, signal.SIGKILL)
        killed = time.monotonic()
        wait_for(
            lambda: sum(map(len, leases_running(client).values())) == 0,
            timeout=20,
            message="the killed kernel's leases to end",
        )
        wait_for(lambda: not leases_on_workers(client), timeout=10, message="the workers to free the threads")
        assert time.monotonic() - killed < 20
        # The threads are free for the owner: a plain task runs at once on each worker, and so does a map.
        for w in client.scheduler_info(n_workers=-1)["workers"]:
            assert client.submit(os.getpid, workers=[w], pure=False).result(timeout=10) > 0
        assert jc.map(abs, [-1, -2, -3], client=owner, progress=False) == [1, 2, 3]
    finally:
        stop_jupyter_named_kernel(km, kc)
        owner.close()


def test_shutting_down_the_kernel_stops_its_cluster(tmp_path):
    """A kernel asked to shut down (Jupyter's "Shut Down Kernel", closing a notebook) stops its
    clusters first: records, credentials and workers go, quietly.  ipykernel signalled the workers
    and kept at multiprocessing's resource tracker (which ignores SIGTERM) while the kernel
    manager, after half its wait, killed the kernel before any exit hook ran: all stayed."""
    km = KernelManager(kernel_name="python3")
    # Jupyter waits 5 s (SIGTERM at 2.5 s); twice that, for a loaded machine
    km.shutdown_wait_time = 10
    stderr_path = tmp_path / "kernel.err"
    with open(stderr_path, "w") as stderr:
        km.start_kernel(stderr=stderr)
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        worker_pids = _start_cluster(kc, "shut-down")
        files = [os.path.join(registry.registry_dir(), f"shut-down{suffix}") for suffix in (".json", ".pem", ".tls")]
        assert all(os.path.exists(p) for p in files)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
    assert not [p for p in files if os.path.exists(p)]
    wait_for(
        lambda: (
            not [p for p in worker_pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        ),
        timeout=30,
        message="the workers to exit",
    )
    printed = stderr_path.read_text()
    assert "Traceback" not in printed and " - ERROR - " not in printed, printed
