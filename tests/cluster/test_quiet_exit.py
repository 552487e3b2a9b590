"""Quiet exits: no traceback and no ERROR line when a script, an IPython shell or a kernel stops its cluster.

Each case runs real processes (a script, IPython, a Jupyter kernel through
nbclient) and reads what they print.  Two ways make the exit-time race real:

* a loaded machine (:func:`busy_machine`: more spinning processes than cores),
  as in CI, where a worker's heartbeat takes long enough to overlap its close;
* a worker whose heartbeat is still in flight when it closes, for certain: a
  Dask worker metric (``Worker.metrics``, which each heartbeat awaits) that
  returns only once the worker is closing (:data:`SLOW_HEARTBEAT`).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap
import time

import pytest

from ..helpers import cell_text
from .test_scripts import GUARDED, MODES, RESULT, _write, run_python

#: what a noisy exit prints: Python's tracebacks and Dask's "<time> - <logger> - ERROR - <message>" lines
NOISE = ("Traceback", " - ERROR - ", "Compute Failed")

#: a worker plugin whose heartbeat is in flight when the worker closes (defined in __main__: sent by value)
SLOW_HEARTBEAT = """\
import asyncio

from distributed import WorkerPlugin


async def _until_closing(worker):
    from distributed.core import Status

    while worker.status == Status.running:  # the heartbeat that awaits this one ends only in the close
        await asyncio.sleep(0.01)
    return 0


class SlowHeartbeat(WorkerPlugin):
    name = "test-slow-heartbeat"

    def setup(self, worker):
        worker.metrics["test-until-closing"] = _until_closing
"""


def _noise(text: str) -> list[str]:
    return [line for line in text.splitlines() if any(n in line for n in NOISE)]


@contextlib.contextmanager
def busy_machine(n: int = 4, seconds: float = 240):
    """``n`` processes spinning on the CPU while the block runs (each ends by itself after ``seconds``)."""
    spin = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"
    procs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(n)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait(timeout=30)


# -- scripts -------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("mode", list(MODES))
def test_guarded_pool_script_exits_quietly_under_load(tmp_path, mode):
    script = _write(tmp_path, "guarded.py", GUARDED)
    with busy_machine():
        for _ in range(2):
            proc = run_python([str(script)], tmp_path, mode)
            assert proc.returncode == 0, proc.stderr
            assert RESULT in proc.stdout.splitlines(), proc.stdout
            assert not _noise(proc.stderr), proc.stderr


@pytest.mark.parametrize("mode", list(MODES))
def test_heartbeat_in_flight_at_close_logs_nothing(tmp_path, mode):
    """A worker closing while its heartbeat runs: Dask logged "Unexpected exception during
    heartbeat" (``RuntimeError: ConnectionPool is closed``) with tracebacks at the script's exit."""
    body = SLOW_HEARTBEAT + GUARDED.replace(
        "import jupyter_cluster as jc\n", "import jupyter_cluster as jc\n\n"
    ).replace(
        "    with jc.Pool(2) as p:\n",
        "    with jc.Pool(2) as p:\n        p._client.register_plugin(SlowHeartbeat())\n",
    )
    script = _write(tmp_path, "slow_heartbeat.py", body)
    proc = run_python([str(script)], tmp_path, mode)
    assert proc.returncode == 0, proc.stderr
    assert RESULT in proc.stdout.splitlines(), proc.stdout
    assert not _noise(proc.stderr), proc.stderr


STOP_AT_ONCE = """\
import jupyter_cluster as jc

if __name__ == "__main__":
    h = jc.start(workers=2)
    h.stop()
    print("stopped")
"""


@pytest.mark.parametrize("mode", list(MODES))
def test_a_stop_right_after_the_start_is_quiet(tmp_path, mode):
    """The stop waits for the start's engine warm-up: cut off, it printed a false notice
    ("the workers could not load the engine's handlers ... maps go through the Dask
    scheduler") and the scheduler an ERROR line ("broadcast to ... failed")."""
    script = _write(tmp_path, "stop_at_once.py", STOP_AT_ONCE)
    proc = run_python([str(script)], tmp_path, mode)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "stopped", proc.stdout
    assert not _noise(proc.stderr) and "jupyter_cluster:" not in proc.stderr, proc.stderr


def test_a_restart_right_after_the_start_is_quiet(tmp_path):
    """The same for a restart (Dask's nannies still say "Restarting worker", as a warning)."""
    script = _write(
        tmp_path, "restart_at_once.py", STOP_AT_ONCE.replace("    h.stop()\n", "    h.restart()\n    h.stop()\n")
    )
    proc = run_python([str(script)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "stopped", proc.stdout
    assert not _noise(proc.stderr) and "jupyter_cluster:" not in proc.stderr, proc.stderr


FAILING_APPLY = """\
import jupyter_cluster as jc


def boom(x):
    raise ValueError(f"bad item {x}")


if __name__ == "__main__":
    with jc.Pool(2) as p:
        for x in range(3):
            try:
                p.apply(boom, (x,))
            except ValueError as exc:
                print("raised:", exc)
"""


def test_a_failing_apply_is_reported_once_not_by_dask(tmp_path):
    """As with multiprocessing, the caller gets the exception and nothing else is printed
    (Dask logged a multi-line "Compute Failed" ERROR for each call)."""
    script = _write(tmp_path, "failing_apply.py", FAILING_APPLY)
    proc = run_python([str(script)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert [line for line in proc.stdout.splitlines() if line.startswith("raised:")] == [
        f"raised: bad item {x}" for x in range(3)
    ], proc.stdout
    assert not _noise(proc.stderr) and "bad item" not in proc.stderr, proc.stderr


OWNER = """\
import os
import sys
import time

import jupyter_cluster as jc

if __name__ == "__main__":
    folder = sys.argv[1]
    h = jc.start(workers=1)
    with open(os.path.join(folder, "address.tmp"), "w") as f:
        f.write(h.address)
    os.rename(os.path.join(folder, "address.tmp"), os.path.join(folder, "address"))
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(folder, "attached")) and time.monotonic() < deadline:
        time.sleep(0.05)
    h.close()
    print("owner stopped its cluster", flush=True)
"""

ATTACHED = """\
import os
import sys
import time

import jupyter_cluster as jc

if __name__ == "__main__":
    folder = sys.argv[1]
    with open(os.path.join(folder, "address")) as f:
        h = jc.connect(f.read())
    print("attached:", h.client.submit(sum, [1, 2]).result(), flush=True)
    waiting = h.client.submit(time.sleep, 600, pure=False)
    open(os.path.join(folder, "attached"), "w").close()
    try:
        waiting.result(timeout=120)
    except Exception as exc:
        print("pending result:", type(exc).__name__, flush=True)
    deadline = time.monotonic() + 30
    while h.client.status != "closed" and time.monotonic() < deadline:
        time.sleep(0.05)
    print("client:", h.client.status, "gone:", h.scheduler_gone(), flush=True)
    time.sleep(2)  # Dask's reconnect loop, if it ran, would log and print here and at exit
"""


def test_attached_script_says_once_that_its_cluster_went_away(tmp_path):
    """Another process stops the cluster this script attached to by address: one line says so,
    the pending result fails at once, the client closes (no retries) and the exit is quiet.
    Dask reconnected for the connect timeout instead, and printed a ``ConnectionRefusedError
    ... CancelledError`` traceback at exit, or an ERROR line after it."""
    owner_py = _write(tmp_path, "owner.py", OWNER)
    attached_py = _write(tmp_path, "attached.py", ATTACHED)
    owner = subprocess.Popen(
        [sys.executable, str(owner_py), str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "address").exists():
            assert owner.poll() is None and time.monotonic() < deadline, owner.communicate()
            time.sleep(0.1)
        address = (tmp_path / "address").read_text()
        proc = run_python([str(attached_py), str(tmp_path)], tmp_path)
        owner_out, owner_err = owner.communicate(timeout=120)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
    assert "owner stopped its cluster" in owner_out, owner_err
    assert proc.returncode == 0, proc.stderr
    assert "pending result: FutureCancelledError" in proc.stdout, proc.stdout
    assert "client: closed gone: True" in proc.stdout, proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0] == (
        f"jupyter_cluster: the scheduler of cluster 'remote-1' at {address} closed the connection "
        "(it stopped, or cannot be reached), so this process let go of it; "
        f"attach again with %cluster connect {address} (jupyter_cluster.connect in a script) once it runs."
    )


# -- IPython and Jupyter kernels --------------------------------------------------------------------
IPYTHON_SESSION = (
    "%load_ext jupyter_cluster\n"
    "%cluster start --workers 2 --name quiet-shell\n" + SLOW_HEARTBEAT + "\nimport jupyter_cluster as jc\n"
    "jc.current().client.register_plugin(SlowHeartbeat())\n"
    "%cluster stop\n"
    "import time\n"
    "time.sleep(2)\n"
    "print('after stop')\n"
)


@pytest.mark.parametrize("mode", list(MODES))
def test_cluster_stop_in_an_ipython_shell_prints_no_traceback(tmp_path, mode):
    # one cell, as typed at the prompt (``ipython file.ipy`` would make the workers import the file)
    proc = run_python(
        ["-m", "IPython", "--quick", "--no-banner", "--colors=NoColor", "-c", IPYTHON_SESSION], tmp_path, mode
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Stopped cluster 'quiet-shell'" in proc.stdout and "after stop" in proc.stdout, proc.stdout
    assert not _noise(proc.stdout + proc.stderr), proc.stdout + proc.stderr


@pytest.mark.slow
def test_cluster_stop_in_a_notebook_prints_no_traceback_under_load(capfd):
    import nbformat
    from nbclient import NotebookClient

    cells = [
        "%load_ext jupyter_cluster",
        "%cluster start --workers 2 --name quiet-nb",
        SLOW_HEARTBEAT
        + textwrap.dedent(
            """\
            import jupyter_cluster as jc

            jc.current().client.register_plugin(SlowHeartbeat())


            def boom(x):
                raise ValueError(f"bad item {x}")


            with jc.Pool() as p:
                try:
                    p.apply(boom, (1,))
                except ValueError as exc:
                    print("raised:", exc)
            """
        ),
        "%cluster stop",
        "import time\ntime.sleep(3)",
        "print('end')",
    ]
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    with busy_machine():
        NotebookClient(nb, timeout=180, kernel_name="python3").execute()
    texts = [cell_text(cell) for cell in nb.cells]
    assert texts[2].strip() == "raised: bad item 1", texts
    assert "Stopped cluster 'quiet-nb'" in texts[3], texts
    assert texts[5].strip() == "end", texts
    assert not _noise("\n".join(texts)), texts
    # What the workers print reaches a notebook through the kernel's stderr, which ipykernel
    # forwards to the cell -- except under pytest (it checks PYTEST_CURRENT_TEST): then the
    # kernel's stderr is this test's, captured here.
    printed = capfd.readouterr()
    assert not _noise(printed.out + printed.err), printed.err
