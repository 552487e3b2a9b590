"""%%parallel through a real Jupyter kernel (nbclient): auto-start, results, remote traceback, interrupt."""

from __future__ import annotations

import os
import re
import signal
import time

import nbformat
import pytest
from nbclient import NotebookClient


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _text(cell) -> str:
    parts = []
    for o in cell.outputs:
        if o.get("output_type") == "stream":
            parts.append(o["text"])
        elif o.get("output_type") == "error":
            parts.append("\n".join(o["traceback"]))
    return ANSI.sub("", "".join(parts))


@pytest.fixture(scope="module")
def notebook_kernel():
    """An nbclient kernel whose default cluster has 2 single-threaded workers."""
    os.environ["DASK_JUPYTER_CLUSTER__LOCAL__WORKERS"] = "2"
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    client = NotebookClient(nb, timeout=180, kernel_name="python3", allow_errors=True)
    try:
        with client.setup_kernel():
            yield client, nb
            try:
                run_cell(client, nb, "%cluster stop")
            except Exception:
                pass
    finally:
        os.environ.pop("DASK_JUPYTER_CLUSTER__LOCAL__WORKERS", None)


def run_cell(client, nb, source: str):
    cell = nbformat.v4.new_code_cell(source)
    nb.cells.append(cell)
    client.execute_cell(cell, len(nb.cells) - 1)
    return cell


def test_first_parallel_cell_starts_the_cluster_and_fills_out(notebook_kernel):
    client, nb = notebook_kernel
    run_cell(client, nb, "%load_ext jupyter_cluster\nimport math\nk = 3")
    cell = run_cell(client, nb, "%%parallel x, y in zip(range(6), 'abcdef') --out pairs --no-progress\nprint('item', x)\ny * (x % k) + str(math.floor(x / 2))")
    out = _text(cell)
    assert "Started cluster" in out and "2 worker threads" in out
    assert "[item 0] item 0" in out
    check = run_cell(client, nb, "print(pairs)\nprint('x' in globals())")
    assert _text(check).split("\n")[:2] == [str(["0", "b0", "cc1", "1", "e2", "ff2"]), "False"]


def test_failing_item_shows_the_cell_line_in_the_notebook(notebook_kernel):
    client, nb = notebook_kernel
    cell = run_cell(client, nb, "%%parallel i in range(8) --no-progress\nv = 10 - i\n100 // (v - 5)")
    err = [o for o in cell.outputs if o.get("output_type") == "error"]
    assert err and err[0]["ename"] == "ZeroDivisionError"
    tb = ANSI.sub("", "\n".join(err[0]["traceback"]))
    assert "Cell In[" in tb and "line 3" in tb and "item 5 (5) failed" in tb


def test_kernel_interrupt_cancels_within_two_seconds(notebook_kernel):
    from jupyter_client import BlockingKernelClient

    client, nb = notebook_kernel
    kc = BlockingKernelClient()
    kc.load_connection_info(client.km.get_connection_info())
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    msg_id = kc.execute("%%parallel i in range(200) --no-progress\nimport time\ntime.sleep(0.1)\ni")
    time.sleep(3.0)
    t0 = time.monotonic()
    os.kill(client.km.provisioner.process.pid, signal.SIGINT)  # what the stop button does
    outputs = []
    while True:
        msg = kc.get_iopub_msg(timeout=30)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            outputs.append(msg["content"]["text"])
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    elapsed = time.monotonic() - t0
    reply = kc.get_shell_msg(timeout=10)
    kc.stop_channels()
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
    assert elapsed < 2.0 + 0.5, f"took {elapsed:.1f} s to stop"
    text = "".join(outputs)
    assert "Interrupted:" in text and "of 200 items had finished" in text
    after = run_cell(client, nb, "job = _parallel_job\nprint(job.state, job.done > 0, len(job.results) == job.done)")
    assert _text(after).strip() == "cancelled True True"
    t1 = time.monotonic()
    again = run_cell(client, nb, "%%parallel i in range(4) --no-progress\ni * 2")
    assert "error" not in [o.get("output_type") for o in again.outputs]
    assert time.monotonic() - t1 < 15
    check = run_cell(client, nb, "print(_parallel)")
    assert _text(check).strip() == "[0, 2, 4, 6]"


def test_syntax_error_in_the_kernel_is_one_sentence(notebook_kernel):
    client, nb = notebook_kernel
    cell = run_cell(client, nb, "%%parallel i in range(3)\nfor\n")
    tb = _text(cell)
    assert "UsageError" in tb and "line 2 of the cell is not valid Python" in tb
