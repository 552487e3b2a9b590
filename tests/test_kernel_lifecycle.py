"""%cluster through real Jupyter kernels: a notebook run by nbclient, and kill -9 of a kernel."""

from __future__ import annotations

import json
import os
import signal

import nbformat
import psutil
from jupyter_client import KernelManager
from nbclient import NotebookClient

from jupyter_cluster import registry

from .conftest import wait_for
from .helpers import kernel_ok


def _notebook(*sources: str) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def test_cluster_magic_in_a_real_notebook():
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


def _execute(kc, code: str, timeout: float = 120) -> str:
    """Run ``code`` in the kernel and return its stdout; fail on an error reply."""
    return kernel_ok(kc, code, timeout)


def test_kill_9_of_the_kernel_leaves_no_worker_and_no_live_record():
    km = KernelManager(kernel_name="python3")
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        _execute(kc, "%load_ext jupyter_cluster\n%cluster start --workers 2 --name doomed")
        out = _execute(
            kc,
            "import os, json, jupyter_cluster as jc\n"
            "print(json.dumps(sorted(jc.current().client.run(os.getpid).values())))",
        )
        worker_pids = json.loads(out.strip().splitlines()[-1])
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
