"""Item functions the SSH tests map; shipped to the hosts by value (the hosts do not import ``tests``)."""

from __future__ import annotations


def slow_item(folder: str, x: int) -> tuple[int, int, str]:
    """Mark ``x`` as started on this host, wait until ``go`` exists in ``folder`` (items from 4 on), return ``x*x``.

    The hosts share this machine's file system, so the markers tell the test
    which host ran what, and the ``go`` file holds the map open until the
    test has pulled a host's plug.
    """
    import os
    import time

    from distributed import get_worker

    host = get_worker().address.split("//")[1].rsplit(":", 1)[0]
    open(os.path.join(folder, f"{x}-{host}"), "w").close()
    deadline = time.monotonic() + 120
    while x >= 4 and not os.path.exists(os.path.join(folder, "go")) and time.monotonic() < deadline:
        time.sleep(0.05)
    return x, x * x, host


def noisy_item(x: int) -> int:
    """Write 512 KiB to the worker process's own standard error (past any capture), return ``x``."""
    import os

    chunk = (f"item {x} ".encode() * 8192)[:65536]
    for _ in range(8):
        os.write(2, chunk)
    return x
