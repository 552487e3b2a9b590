"""%%parallel through a real Jupyter kernel (nbclient): auto-start, results, remote traceback, interrupt."""

from __future__ import annotations

import os
import re
import signal
import time

import nbformat
import pytest
from nbclient import NotebookClient

from ..conftest import wait_for
from ..helpers import ANSI, cell_text


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
    cell = run_cell(
        client,
        nb,
        "%%parallel x, y in zip(range(6), 'abcdef') --out pairs --no-progress\nprint('item', x)\ny * (x % k) + str(math.floor(x / 2))",
    )
    out = cell_text(cell)
    assert "Started cluster" in out and "2 worker threads" in out
    assert "[item 0] item 0" in out
    check = run_cell(client, nb, "print(pairs)\nprint('x' in globals())")
    assert cell_text(check).split("\n")[:2] == [str(["0", "b0", "cc1", "1", "e2", "ff2"]), "False"]


def test_failing_item_shows_the_cell_line_in_the_notebook(notebook_kernel):
    client, nb = notebook_kernel
    cell = run_cell(client, nb, "%%parallel i in range(8) --no-progress\nv = 10 - i\n100 // (v - 5)")
    err = [o for o in cell.outputs if o.get("output_type") == "error"]
    assert err and err[0]["ename"] == "ZeroDivisionError"
    tb = ANSI.sub("", "\n".join(err[0]["traceback"]))
    assert "Cell In[" in tb and "line 3" in tb and "item 5 (5) failed" in tb


def test_kernel_interrupt_cancels_within_two_seconds(notebook_kernel, tmp_path):
    from jupyter_client import BlockingKernelClient

    client, nb = notebook_kernel
    kc = BlockingKernelClient()
    kc.load_connection_info(client.km.get_connection_info())
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    started = tmp_path / "started"  # one line per item begun, written by the workers
    msg_id = kc.execute(
        f"%%parallel i in range(200) --no-progress\nimport time\nopen({str(started)!r}, 'a').write('x\\n')\n"
        "time.sleep(0.1)\ni"
    )
    # three items begun on two single-threaded workers: at least one has finished
    wait_for(lambda: started.exists() and len(started.read_text().splitlines()) >= 3, 60, message="items running")
    t0 = time.monotonic()
    os.kill(client.km.provisioner.process.pid, signal.SIGINT)  # what the stop button does
    outputs, errors = [], []
    while True:
        msg = kc.get_iopub_msg(timeout=30)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            outputs.append(msg["content"]["text"])
        if msg["msg_type"] == "error":
            errors.append(ANSI.sub("", "\n".join(msg["content"]["traceback"])))
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    elapsed = time.monotonic() - t0
    reply = kc.get_shell_msg(timeout=10)
    kc.stop_channels()
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
    assert elapsed < 2.0 + 0.5, f"took {elapsed:.1f} s to stop"
    text = "".join(outputs)
    assert "Interrupted:" in text and "of 200 items had finished" in text
    # the summary line, then one short KeyboardInterrupt line: nothing of our internals
    assert errors == ["KeyboardInterrupt: the %%parallel cell was interrupted; see the line above."], errors
    after = run_cell(client, nb, "job = _parallel_job\nprint(job.state, job.done > 0, len(job.results) == job.done)")
    assert cell_text(after).strip() == "cancelled True True"
    t1 = time.monotonic()
    again = run_cell(client, nb, "%%parallel i in range(4) --no-progress\ni * 2")
    assert "error" not in [o.get("output_type") for o in again.outputs]
    assert time.monotonic() - t1 < 15
    check = run_cell(client, nb, "print(_parallel)")
    assert cell_text(check).strip() == "[0, 2, 4, 6]"


def test_syntax_error_in_the_kernel_is_one_sentence(notebook_kernel):
    client, nb = notebook_kernel
    cell = run_cell(client, nb, "%%parallel i in range(3)\nfor\n")
    tb = cell_text(cell)
    assert "UsageError" in tb and "line 2 of the cell is not valid Python" in tb


def _error_lines(cell) -> list[str]:
    err = [o for o in cell.outputs if o.get("output_type") == "error"]
    assert err, f"cell {cell.source!r} raised nothing: {cell_text(cell)}"
    return ANSI.sub("", "\n".join(err[0]["traceback"])).splitlines()


def _frame_block(lines: list[str], heading: str) -> list[str]:
    """The lines of one traceback frame: its heading and the numbered source lines below it."""
    start = next(i for i, ln in enumerate(lines) if ln.startswith(heading))
    block = [lines[start]]
    for ln in lines[start + 1 :]:
        if not re.match(r"^(---->|\s+)\s*\d+ ", ln):
            break
        block.append(ln)
    return block


def test_saved_traceback_names_the_cell_and_line_like_a_local_error():
    """In a notebook run by nbclient (ipykernel, IPython 9), a failing item's saved error output
    names the cell's own prompt number and line, with the arrow and neighbouring lines exactly
    as a local error in the same cell, also inside a function defined in an earlier cell."""
    os.environ["DASK_JUPYTER_CLUSTER__LOCAL__WORKERS"] = "1"
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    sources = [
        "%load_ext jupyter_cluster",
        "def ratio(v):\n    w = v - 2\n    return 10 / w",
        "%%parallel x in [4, 2, 0, 1] --no-progress\nscale = 10\nscale / x\n# after",
        "for x in [4, 2, 0, 1]:\n    scale = 10\n    scale / x\n# after",
        "%%parallel x in [4, 3, 2] --no-progress\nscale = 10\nratio(x) * scale",
        "ratio(2)",
        "%cluster stop",
    ]
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    try:
        NotebookClient(nb, timeout=180, kernel_name="python3", allow_errors=True).execute()
    finally:
        os.environ.pop("DASK_JUPYTER_CLUSTER__LOCAL__WORKERS", None)
    remote, local, remote_fn, local_fn = nb.cells[2], nb.cells[3], nb.cells[4], nb.cells[5]

    lines = _error_lines(remote)
    n = remote.execution_count
    assert _frame_block(lines, "Cell In[") == [
        f"Cell In[{n}], line 3",
        "      1 %%parallel x in [4, 2, 0, 1] --no-progress",
        "      2 scale = 10",
        "----> 3 scale / x",
        "      4 # after",
    ]
    # the same layout as a local error in a cell (arrow, numbers, context)
    local_block = _frame_block(_error_lines(local), "Cell In[")
    assert local_block[0] == f"Cell In[{local.execution_count}], line 3"
    assert [ln[:7] for ln in local_block[1:]] == ["      1", "      2", "----> 3", "      4"]
    assert lines[-2:] == [
        "ZeroDivisionError: division by zero",
        "%%parallel: item 2 (0) failed on worker " + lines[-1].split("on worker ")[1],
    ]

    # a function from an earlier cell: its own cell, name, arguments and lines, as locally
    lines = _error_lines(remote_fn)
    assert _frame_block(lines, "Cell In[")[:4] == [
        f"Cell In[{remote_fn.execution_count}], line 3",
        "      1 %%parallel x in [4, 3, 2] --no-progress",
        "      2 scale = 10",
        "----> 3 ratio(x) * scale",
    ]
    fn_heading = f"Cell In[{nb.cells[1].execution_count}], line 3, in ratio(v)"
    assert (
        _frame_block(lines, fn_heading)
        == _frame_block(_error_lines(local_fn), fn_heading)
        == [
            fn_heading,
            "      1 def ratio(v):",
            "      2     w = v - 2",
            "----> 3     return 10 / w",
        ]
    )
    assert "parallel_magic.py" not in "\n".join(lines) and "<dynamic-code>" not in "\n".join(lines)
