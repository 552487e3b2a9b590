"""Network namespaces as the tests' hosts: every process in one is that host's, so killing them all pulls its plug."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterable


def pids(namespace: str) -> list[int]:
    """The processes in ``namespace`` (none if it is gone)."""
    out = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True, timeout=60).stdout
    return [int(p) for p in out.split()]


def kill_all(namespace: str) -> list[int]:
    """SIGKILL every process in ``namespace`` (they are all the test's: the namespace is); their ids."""
    found = pids(namespace)
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return found


def remove(namespaces: Iterable[str], procs: Iterable[subprocess.Popen]) -> None:
    """Kill every process in ``namespaces``, reap ``procs`` (the test's handles on some of them), delete the namespaces."""
    namespaces = list(namespaces)
    for ns in namespaces:
        kill_all(ns)
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
    for ns in namespaces:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, text=True, timeout=60)
