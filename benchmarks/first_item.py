"""Map call → first item starts: the latency a short map pays before any work, warm and cold.

Each map is 2 items of a function that returns the wall-clock time at which it
started (workers run on this machine, so the clocks are the same).  The
latency is the earliest item start minus the time just before the call.
Measured back to back (the previous map's leases still there), after the
client was idle for each of ``--idle`` seconds (``--long`` adds 30 s, fewer
times), and as the first map of a freshly started cluster
(``jupyter_cluster.start``, ``--fresh`` clusters, each mapped on once
``--fresh-delay`` seconds after it started).  Run::

    python benchmarks/first_item.py [--workers 2] [--repeat 7] [--idle 1,3,8] [--long] [--fresh 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _row(rows: dict, name: str, ms: list[float]) -> None:
    rows[name] = {
        "median_ms": statistics.median(ms),
        "min_ms": min(ms),
        "max_ms": max(ms),
        "n": len(ms),
        "samples_ms": [round(x, 3) for x in ms],  # in order: outliers and drift stay visible
    }
    print(
        f"{name:<26} median {statistics.median(ms):6.2f} ms  (min {min(ms):.2f}, max {max(ms):.2f}, n {len(ms)})",
        flush=True,
    )


def _first_item_ms(wl, mapping, client) -> float:
    t0 = time.time()
    starts = mapping.map(wl.started_at, range(2), client=client, progress=False)
    return (min(starts) - t0) * 1000


def _commit() -> str | None:
    """The commit of the jupyter_cluster being timed (its checkout's HEAD; None outside a git checkout)."""
    import subprocess

    import jupyter_cluster

    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=os.path.dirname(os.path.abspath(jupyter_cluster.__file__)),
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def main(argv=None) -> int:
    import workloads as wl
    from distributed import Client, LocalCluster

    from jupyter_cluster import mapping

    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--idle", default="1,3,8", help="idle gaps before a map, seconds, comma-separated")
    ap.add_argument("--long", action="store_true", help="also after 30 s idle (--long-repeat times)")
    ap.add_argument("--long-repeat", type=int, default=3)
    ap.add_argument("--fresh", type=int, default=3, help="fresh clusters whose first map is timed (0: none)")
    ap.add_argument(
        "--fresh-delay", type=float, default=1.0, help="seconds between a fresh cluster's start and its map"
    )
    ap.add_argument("--out", help="write the figures as JSON here")
    args = ap.parse_args(argv)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    # A plain Dask cluster (2 processes × 1 thread, TCP): what is timed is the map, not the launcher.
    cluster = LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=None)
    handle = Client(cluster)
    rows: dict = {}
    loads = [os.getloadavg()[0]]
    try:
        mapping.map(wl.started_at, range(2 * args.workers), client=handle, progress=False)  # warm up

        gaps = [float(g) for g in args.idle.split(",")] if args.idle else []
        cases = [("back to back", 0.0, args.repeat)] + [(f"after {g:g} s idle", g, args.repeat) for g in gaps]
        if args.long:
            cases.append(("after 30 s idle", 30.0, args.long_repeat))
        for name, gap, repeat in cases:
            _first_item_ms(wl, mapping, handle)
            ms = []
            for _ in range(repeat):
                time.sleep(gap if gap else 0.02)
                ms.append(_first_item_ms(wl, mapping, handle))
            _row(rows, name, ms)
            loads.append(os.getloadavg()[0])
    finally:
        handle.close()
        cluster.close()
    if args.fresh > 0:
        import jupyter_cluster as jc

        ms = []
        for _ in range(args.fresh):
            fresh = jc.start(workers=args.workers, threads=1)
            try:
                time.sleep(args.fresh_delay)
                ms.append(_first_item_ms(wl, mapping, fresh))
            finally:
                fresh.close()
        _row(rows, f"fresh cluster, map after {args.fresh_delay:g} s", ms)
        loads.append(os.getloadavg()[0])
    print(f"load (1 min) during the run: {min(loads):.1f}-{max(loads):.1f}", flush=True)
    if args.out:
        meta = {"date_utc": started, "commit": _commit(), "argv": sys.argv[1:], "cpus": os.cpu_count()}
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "load": loads, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
