"""Helpers shared by the test modules (fixtures live in conftest.py)."""

from __future__ import annotations

import os
import re
import time
import uuid

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def unique_topic(name: str) -> str:
    """A metrics topic name no other test uses (stores are per process and outlive a test)."""
    return f"{name}-{uuid.uuid4().hex[:6]}"


def cell_text(cell) -> str:
    """What a notebook cell shows as text: streams, tracebacks and plain-text results, without colours."""
    parts = []
    for o in cell.get("outputs", []):
        if o.get("output_type") == "stream":
            parts.append(o["text"])
        elif o.get("output_type") == "error":
            parts.append("\n".join(o["traceback"]))
        elif "text/plain" in o.get("data", {}):
            parts.append(o["data"]["text/plain"])
    return ANSI.sub("", "".join(parts))


def kernel_execute(kc, code: str, timeout: float = 120, retry_aborted: bool = False) -> tuple[str, str]:
    """Run ``code`` through a kernel client; return the reply's status and the cell's stdout and tracebacks.

    With ``retry_aborted``, a cell the kernel aborted (ipykernel aborts what was
    queued behind an error, for a moment after it) is sent again, up to 20 times.
    """
    out: list[str] = []

    def hook(msg):
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            out.append("\n".join(msg["content"]["traceback"]))

    for _ in range(20 if retry_aborted else 1):
        reply = kc.execute_interactive(code, timeout=timeout, output_hook=hook)
        if reply["content"]["status"] != "aborted":
            break
        time.sleep(0.1)
    return reply["content"]["status"], "".join(out)


def kernel_ok(kc, code: str, timeout: float = 120, retry_aborted: bool = False) -> str:
    """:func:`kernel_execute`, failing the test unless the kernel replied ok; returns the output."""
    status, out = kernel_execute(kc, code, timeout, retry_aborted)
    assert status == "ok", out
    return out


def gated_square(flag, x):
    """Items from 100 on wait for ``flag`` to exist, so a map outlasts the kills of a fault test.

    Workers import it from here (by reference), as they import the test modules.
    """
    time.sleep(0.05)
    deadline = time.monotonic() + 120
    while x >= 100 and not os.path.exists(flag) and time.monotonic() < deadline:
        time.sleep(0.05)
    return x * x


def start_jupyter_named_kernel(tmp_path):
    """A real, ready python3 kernel whose connection file is ``kernel-<id>.json``, as a Jupyter server names it.

    Returns ``(km, kc, kernel_id)``; the caller stops the channels and shuts the kernel down.
    """
    from jupyter_client import KernelManager

    kernel_id = str(uuid.uuid4())
    km = KernelManager(kernel_name="python3", connection_file=str(tmp_path / f"kernel-{kernel_id}.json"))
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
    except BaseException:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        raise
    return km, kc, kernel_id


def stop_jupyter_named_kernel(km, kc) -> None:
    """Undo :func:`start_jupyter_named_kernel` (the kernel may already be gone)."""
    kc.stop_channels()
    if km.is_alive():
        km.shutdown_kernel(now=True)


def assert_ran_on_leases(job) -> None:
    """Fail unless the map ``job`` (a ``MapJob``) ran on the direct path: batches sent to leases.

    Not the task path (one Dask task per chunk), which a map falls back to by
    itself when the workers cannot be reached.  ``job.leases`` counts the leases
    the map placed; a map started within ``engine.linger`` of an earlier map of
    the same client takes over that map's idle leases instead (``reused``).
    """
    assert job.path == "direct", f"the map ran on the {job.path!r} path, not on leases"
    leases = job._counters
    assert leases is not None and job.leases + leases.reused > 0, "the map placed no lease and took over none"


def worker_tls_args(handle) -> list[str]:
    """``dask worker`` options that give a worker the cluster's TLS credentials (none for a plain TCP cluster)."""
    if not handle.address.startswith("tls://"):
        return []
    sec = handle.client.security
    return [
        "--tls-ca-file",
        sec.tls_ca_file,
        "--tls-cert",
        sec.tls_client_cert,
        "--tls-key",
        sec.tls_client_key or sec.tls_client_cert,
    ]


def leases_on_workers(client) -> list[str]:
    """Lease tasks whose thread the workers hold, as the workers see it (a cancelled task holds one until it returns)."""

    def executing(dask_worker):
        return [str(ts.key) for ts in dask_worker.state.executing if str(ts.key).startswith("jc-lease-")]

    return [k for keys in client.run(executing).values() for k in keys]


def leases_running(client) -> dict[str, list[str]]:
    """Lease tasks the scheduler counts as processing, per worker."""
    return {w: [k for k in keys if str(k).startswith("jc-lease-")] for w, keys in client.processing().items()}


def run_notebook(cells: list[str], timeout: float = 120, **client_kwargs):
    """A new notebook of ``cells`` executed top to bottom in a real python3 kernel (nbclient); returned."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    NotebookClient(nb, timeout=timeout, kernel_name="python3", **client_kwargs).execute()
    return nb
