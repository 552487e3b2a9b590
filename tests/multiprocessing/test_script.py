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
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("workers_script.py")
ROOT = Path(__file__).resolve().parents[2]


def _run(path: Path) -> list[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return [line for line in done.stdout.splitlines() if not line.startswith("Started cluster ")]


@pytest.mark.timeout(300)
def test_the_workers_script_gives_the_same_output_on_the_cluster(tmp_path):
    text = SCRIPT.read_text()
    assert "import multiprocessing as mp\n" in text
    ported = tmp_path / "ported.py"
    ported.write_text(
        text.replace("import multiprocessing as mp\n", "import jupyter_cluster.multiprocessing as mp\n", 1)
    )
    expected = _run(SCRIPT)
    assert expected[0].startswith("results [(0, 0)")
    assert _run(ported) == expected
