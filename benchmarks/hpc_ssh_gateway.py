"""SSH hosts and dask-gateway beside local, in one run: start-to-first-item.

For each repetition (the backends' order rotates, so drift on a shared machine
hits all alike): ``jupyter_cluster.start(backend=B, ...)``, then a one-item
``jupyter_cluster.map``; the time from just before the start to its result,
then the stop's time.

* ssh: 3 sshd hosts in network namespaces on this machine (the tests' own,
  ``tests/hpc/ssh_hosts.py``): the scheduler on the first, one worker on each
  of the two others; TLS, with the credentials copied to the hosts first.
  Includes one SSH login per host for the checks and the copy, then Dask's
  SSHCluster (one more login per process, the remote Pythons' imports).
* gateway: a dask-gateway-server with its local backend and password auth
  (``tests/hpc/gateway_server.py``), started once, outside the timing; one
  worker asked for at start.
* local: ``workers=2`` local processes (the fork server warm after the first).

Run as root (namespaces, sshd)::

    python benchmarks/hpc_ssh_gateway.py [--reps 3] [--backends ssh,gateway,local] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the tests' host and gateway helpers


def one(backend: str, options: dict) -> dict:
    import jupyter_cluster as jc

    t0 = time.perf_counter()
    handle = jc.start(backend=backend, **options)
    started = time.perf_counter() - t0
    try:
        assert jc.map(abs, [-1], client=handle, progress=False) == [1]
        first_item = time.perf_counter() - t0
    finally:
        t = time.perf_counter()
        handle.close()
        stop = time.perf_counter() - t
    return {"start_s": started, "first_item_s": first_item, "stop_s": stop}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--backends", default="ssh,gateway,local")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    backends = [b for b in args.backends.split(",") if b]

    import dask

    scratch = Path(tempfile.mkdtemp(prefix="jc-bench-hpc-"))
    os.environ.setdefault("JUPYTER_RUNTIME_DIR", str(scratch / "runtime"))
    settings: dict = {}
    options: dict = {"local": {"workers": 2, "threads": 1}}
    hosts = server = None
    rows: dict[str, list[dict]] = {b: [] for b in backends}
    try:
        if "ssh" in backends:
            from tests.hpc.ssh_hosts import SSHHosts

            hosts = SSHHosts(scratch / "ssh", 3)
            hosts.build()
            settings.update(hosts.dask_config())
            options["ssh"] = {"hosts": hosts.addresses}
        if "gateway" in backends:
            import dask_gateway  # noqa: F401  (its config defaults first)

            from tests.hpc.gateway_server import GatewayServer

            server = GatewayServer(scratch / "gateway")
            server.start()
            settings.update(server.dask_config())
            options["gateway"] = {"workers": 1}
        with dask.config.set(settings):
            for rep in range(args.reps):
                order = backends[rep % len(backends) :] + backends[: rep % len(backends)]
                for b in order:
                    row = one(b, options[b])
                    rows[b].append(row)
                    print(
                        f"rep {rep} {b:<8} start {row['start_s']:6.2f} s  first item {row['first_item_s']:6.2f} s  "
                        f"stop {row['stop_s']:5.2f} s",
                        flush=True,
                    )
    finally:
        if hosts is not None:
            hosts.teardown()
        if server is not None:
            server.stop()
    summary = {
        b: {
            "first_item_median_s": statistics.median(r["first_item_s"] for r in rs),
            "first_item_min_s": min(r["first_item_s"] for r in rs),
            "first_item_max_s": max(r["first_item_s"] for r in rs),
            "stop_median_s": statistics.median(r["stop_s"] for r in rs),
            "runs": rs,
        }
        for b, rs in rows.items()
        if rs
    }
    for b, s in summary.items():
        print(
            f"{b:<8} start-to-first-item median {s['first_item_median_s']:.2f} s "
            f"(min {s['first_item_min_s']:.2f}, max {s['first_item_max_s']:.2f}); stop median {s['stop_median_s']:.2f} s"
        )
    load = os.getloadavg()[0]
    print(f"load average at the end: {load:.1f} on {os.cpu_count()} cores")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"summary": summary, "load_end": load, "cpus": os.cpu_count()}, f, indent=1)


if __name__ == "__main__":
    main()
