"""Done when: a detached %%parallel on a kept cluster outlives a kernel killed with -9.

``%cluster start --keep``, a detached cell whose items report a metric, ``kill -9`` of
the kernel while it runs; a second, fresh kernel attaches by name and gets the
results, equal to the serial ones, in order.
"""

from __future__ import annotations

import json
import os
import signal
import time

import psutil
import pytest
from jupyter_client import KernelManager

from ..conftest import wait_for
from ..helpers import kernel_ok

pytestmark = pytest.mark.slow

N, SECONDS = 20, 0.2
CELL = f"""%%parallel x in range({N}) --detach sweep
import time
time.sleep({SECONDS})
jupyter_cluster.report(step=x, loss=float(x) ** 0.5)
x * x + 1
"""


def _kernel():
    km = KernelManager(kernel_name="python3")
    km.start_kernel(env={**os.environ})
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    return km, kc


def _stop(km, kc):
    kc.stop_channels()
    if km.is_alive():
        km.shutdown_kernel(now=True)


def test_detached_cell_outlives_a_killed_kernel():
    km, kc = _kernel()
    host_pid = None
    try:
        kernel_ok(kc, "%load_ext jupyter_cluster\nimport jupyter_cluster")
        out = kernel_ok(kc, "%cluster start --keep --workers 2 --name kept-k --idle-timeout 120")
        assert "Started kept cluster 'kept-k'" in out
        t0 = time.monotonic()
        out = kernel_ok(kc, CELL)
        submitted = time.monotonic() - t0
        assert "Detached job 'sweep'" in out and "kept-k" in out and "job('sweep')" in out, out
        assert submitted < 10, submitted  # returned at once, not after the 20 x 0.2 s of work
        host_pid = json.loads(
            kernel_ok(kc, "import json; print(json.dumps(jupyter_cluster.clusters()[0]['owner_pid']))").strip()
        )
        time.sleep(1.0)
        os.kill(km.provisioner.pid, signal.SIGKILL)  # the kernel dies mid-sweep, as a crash or an OOM kill
        wait_for(lambda: not km.is_alive(), 30, message="the kernel to die")
    finally:
        _stop(km, kc)
    assert psutil.pid_exists(host_pid)
    km2, kc2 = _kernel()
    try:
        code = (
            "import jupyter_cluster as jc\n"
            "r = jc.job('sweep').result(timeout=120)\n"
            f"assert r == [x * x + 1 for x in range({N})], r\n"
            "row = [j for j in jc.jobs() if j['name'] == 'sweep'][0]\n"
            "print(row['state'], row['done'], row['total'], row['cluster'], row['cell'])\n"
        )
        out = kernel_ok(kc2, code, timeout=180)
        assert f"finished {N} {N} kept-k" in out, out
        assert "%%parallel x in range" in out  # the cell it came from
        out = kernel_ok(kc2, "%load_ext jupyter_cluster\n%cluster job sweep --out res\nprint(res[:3])\n%cluster jobs")
        assert f"Detached job 'sweep': {N} results in res." in out and "[1, 2, 5]" in out, out
        assert "sweep" in out.splitlines()[-1] and f"finished   {N}/{N}" in out.splitlines()[-1], out
        # the items' reports reached the cluster while no kernel was attached
        out = kernel_ok(
            kc2,
            "h = jc.connect('kept-k')\n"
            "from jupyter_cluster.telemetry import topic_name\n"
            "print(len(h.client.get_events(topic_name('default'))))",
        )
        assert int(out.strip().splitlines()[-1]) > 0, out
        km2.restart_kernel(now=False)  # a restart (the kernel's own shutdown: it stops its clusters) only detaches
        kc2.wait_for_ready(timeout=60)
        assert psutil.pid_exists(host_pid)
        out = kernel_ok(kc2, "import jupyter_cluster as jc\nprint([c['name'] for c in jc.clusters()])")
        assert "kept-k" in out, out
        kernel_ok(kc2, "%load_ext jupyter_cluster\n%cluster stop kept-k")  # restarted: load it again
        wait_for(lambda: not psutil.pid_exists(host_pid), 60, message="the host to end")
    finally:
        _stop(km2, kc2)
        if host_pid is not None and psutil.pid_exists(host_pid):
            os.kill(host_pid, signal.SIGTERM)
