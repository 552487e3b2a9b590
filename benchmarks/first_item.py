"""Map call → first item starts: the latency a short map pays before any work, warm and cold.

Each map is 2 items of a function that returns the wall-clock time at which it
started (workers run on this machine, so the clocks are the same).  The
latency is the earliest item start minus the time just before the call.
Measured back to back (the previous map's leases still there), and after the
client was idle for each of ``--idle`` seconds.  Run::

    python benchmarks/first_item.py [--workers 2] [--repeat 7] [--idle 1,3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(argv=None) -> int:
    import workloads as wl
    from distributed import Client, LocalCluster

    from jupyter_cluster import mapping

    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--idle", default="1,3", help="idle gaps before a map, seconds, comma-separated")
    ap.add_argument("--out", help="write the figures as JSON here")
    args = ap.parse_args(argv)
    # A plain Dask cluster (2 processes × 1 thread, TCP): what is measured is the map, not the launcher.
    cluster = LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=None)
    handle = Client(cluster)
    rows = {}
    try:
        mapping.map(wl.started_at, range(2 * args.workers), client=handle, progress=False)  # warm up

        def once() -> float:
            t0 = time.time()
            starts = mapping.map(wl.started_at, range(2), client=handle, progress=False)
            return (min(starts) - t0) * 1000

        cases = [("back to back", 0.0)] + [
            (f"after {g:g} s idle", g) for g in map(float, args.idle.split(",") if args.idle else [])
        ]
        for name, gap in cases:
            once()
            ms = []
            for _ in range(args.repeat):
                time.sleep(gap if gap else 0.02)
                ms.append(once())
            rows[name] = {"median_ms": statistics.median(ms), "min_ms": min(ms), "max_ms": max(ms)}
            print(
                f"{name:<20} median {statistics.median(ms):6.2f} ms  (min {min(ms):.2f}, max {max(ms):.2f})", flush=True
            )
    finally:
        handle.close()
        cluster.close()
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"load": os.getloadavg(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
