"""Two processes starting a cluster of the same name at the same moment: exactly one gets it."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from jupyter_cluster.state import registry

# Each process waits for the same instant, then starts ``local-1``; it prints what it got and,
# holding its cluster a moment, lets the other finish its start before stopping.
RACE = """
import sys, time
import jupyter_cluster as jc
from jupyter_cluster.errors import ClusterError
at = float(sys.argv[1])
while time.time() < at:
    time.sleep(0.001)
try:
    handle = jc.start(name="local-1", workers=1, threads=1)
except ClusterError as exc:
    print("REFUSED", exc, flush=True)
    sys.exit(0)
print("STARTED", handle.name, flush=True)
time.sleep(float(sys.argv[2]))
jc.stop(handle.name)
"""

RESERVE = """
import sys, time
from jupyter_cluster.state import registry
from jupyter_cluster.errors import ClusterError
at = float(sys.argv[1])
got = 0
for i in range(int(sys.argv[2])):
    while time.time() < at + i * 0.05:
        pass
    try:
        registry.reserve(f"race-{i}")
        got += 1
    except ClusterError:
        pass
print(got, flush=True)
time.sleep(1.0)
"""


def _race(code: str, *args: str, runtime_dir: str | None = None, timeout: float = 120) -> list[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), os.getcwd()) if p)}
    if runtime_dir is not None:
        # A registry of their own: a default-named start by another process of this test session
        # (a kernel, a script) may hold ``local-1`` at that instant and would refuse both.
        env["JUPYTER_RUNTIME_DIR"] = runtime_dir
    at = time.time() + 4.0  # both interpreters have imported by then, on a loaded machine
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(at), *args], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    try:
        return [p.communicate(timeout=timeout)[0].strip() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_two_processes_reserving_the_same_names_at_once_get_each_exactly_once():
    outs = _race(RESERVE, "40", timeout=60)
    assert sum(int(o) for o in outs) == 40, outs
    time.sleep(0.2)
    assert not any(n.startswith("race-") for n in registry.reserved_names())  # both processes have exited


@pytest.mark.slow  # two cluster starts in two fresh interpreters: about 15-25 s on 2 busy cores
def test_two_processes_starting_local_1_at_once_one_is_refused_in_one_sentence(tmp_path, monkeypatch):
    outs = _race(RACE, "6", runtime_dir=str(tmp_path))
    started = [o for o in outs if o.startswith("STARTED")]
    refused = [o for o in outs if o.startswith("REFUSED")]
    assert started == ["STARTED local-1"] and len(refused) == 1, outs
    message = refused[0].removeprefix("REFUSED ")
    assert "'local-1'" in message and "--name" in message and message.count(". ") == 0, message
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))  # look where the two processes registered
    assert registry.read("local-1") is None  # the winner stopped it; nothing is left behind
    assert "local-1" not in registry.reserved_names()


def test_a_reservation_left_by_a_dead_process_is_taken_over_and_released():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    path = os.path.join(registry.registry_dir(), "ghost" + registry.RESERVED)
    with open(path, "w") as f:
        f.write(f'{{"pid": {dead.pid}, "started": 12345.0}}')
    registry.reserve("ghost")
    assert "ghost" in registry.reserved_names()
    registry.release("ghost")
    assert not os.path.exists(path)
