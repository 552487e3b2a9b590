"""The "done when" of issue 36: a ``multiprocessing`` script runs on the cluster with only its import changed.

``workers_script.py`` (Process workers fed by a Queue, answering through
another Queue and a Pipe, a ``Manager().dict()``, a ``Pool`` whose tasks
write to a manager's Queue) runs under the standard library and then, with
``import jupyter_cluster.multiprocessing as mp``, in a fresh interpreter
that starts its own local cluster; the outputs must be the same (less the
one line announcing the cluster).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("workers_script.py")
ROOT = Path(__file__).resolve().parents[2]


def run_script(path: Path, announced: list[str] | None = None, timeout: float = 240, **env: str) -> list[str]:
    """``path``'s output lines in a fresh interpreter, less the line announcing a started cluster
    (appended to ``announced`` when given).

    A script still running after ``timeout`` seconds fails the test with every thread's stack
    (``-X faulthandler``, then SIGABRT) and what it printed so far: a hang says where it hangs.
    """
    env = dict(os.environ, PYTHONPATH=str(ROOT), **env)
    proc = subprocess.Popen(
        [sys.executable, "-X", "faulthandler", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack, then the process ends
        try:
            stdout, stderr = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        pytest.fail(
            f"{path.name} did not finish in {timeout:.0f} s; it printed:\n{stdout}\nits threads (stderr):\n{stderr[-20000:]}"
        )
    assert proc.returncode == 0, stderr[-3000:]
    lines = stdout.splitlines()
    if announced is not None:
        announced.extend(line for line in lines if line.startswith("Started cluster "))
    return [line for line in lines if not line.startswith("Started cluster ")]


def ported_script(folder: Path) -> Path:
    """``workers_script.py`` with only its import line changed to ``jupyter_cluster.multiprocessing``."""
    text = SCRIPT.read_text()
    assert "import multiprocessing as mp\n" in text
    ported = folder / "ported.py"
    ported.write_text(
        text.replace("import multiprocessing as mp\n", "import jupyter_cluster.multiprocessing as mp\n", 1)
    )
    return ported


@pytest.mark.timeout(300)
def test_the_workers_script_gives_the_same_output_on_the_cluster(tmp_path):
    expected = run_script(SCRIPT)
    assert expected[0].startswith("results [(0, 0)")
    assert run_script(ported_script(tmp_path)) == expected


def test_a_script_that_hangs_fails_with_its_threads_stacks(tmp_path):
    """The harness of the tests above (also the SLURM one): a hang fails with where it hangs, not silently."""
    hang = tmp_path / "hangs.py"
    hang.write_text('import threading, time\nprint("started", flush=True)\nthreading.Event().wait()\n')
    with pytest.raises(pytest.fail.Exception) as failed:
        run_script(hang, timeout=3)
    text = str(failed.value)
    assert "hangs.py did not finish in 3 s" in text
    assert "started" in text  # what it printed before it hung
    assert "in wait" in text  # faulthandler's stack of the main thread: threading.py, line ..., in wait
    assert 'File "' in text
