"""An adaptive local cluster under a map on leases: how soon it grows, how far, and when it shrinks back.

A 1-worker, 1-thread local cluster made adaptive (``ClusterHandle.adapt(1, MAX)``,
Dask's ``Adaptive`` with its own defaults: a look every second, 5 s of work
per thread, 3 idle looks before closing a worker) runs ``jupyter_cluster.map``
of ``--items`` items that each sleep ``--seconds``; a thread counts the
scheduler's workers every 0.1 s.  Printed: the map's wall time, the time to
the second worker, the most workers seen, and the time from the map's end
until the cluster is back at 1 worker (leases linger ``engine.linger`` first).
``--demand false`` turns the engine's demand tasks off (the map then stays
on one worker).  Run::

    python benchmarks/adapt_growth.py [--items 60] [--seconds 0.5] [--max 3] [--linger 60s] [--demand auto]
"""

from __future__ import annotations

import argparse
import json
import threading
import time


def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=60)
    ap.add_argument("--seconds", type=float, default=0.5)
    ap.add_argument("--max", type=int, default=3)
    ap.add_argument("--linger", default="60s")
    ap.add_argument("--demand", default="auto")
    ap.add_argument("--shrink-timeout", type=float, default=180.0)
    args = ap.parse_args()

    import dask

    import jupyter_cluster as jc

    dask.config.set({"jupyter-cluster.engine.linger": args.linger, "jupyter-cluster.engine.demand": args.demand})
    handle = jc.start(workers=1, threads=1)
    try:
        handle.adapt(1, args.max)
        client = handle.client
        seen: list[tuple[float, int]] = []
        stop = threading.Event()

        def count() -> None:
            while not stop.is_set():
                n = len(client.scheduler_info(n_workers=-1)["workers"])
                seen.append((time.monotonic(), n))
                time.sleep(0.1)

        watcher = threading.Thread(target=count, daemon=True)
        t0 = time.monotonic()
        watcher.start()
        out = jc.map(nap, [args.seconds] * args.items, client=handle, progress=False)
        t1 = time.monotonic()
        assert out == [args.seconds] * args.items
        back = None
        while time.monotonic() - t1 < args.shrink_timeout:
            if seen and seen[-1][1] <= 1 and seen[-1][0] > t1:
                back = seen[-1][0] - t1
                break
            time.sleep(0.1)
        stop.set()
        watcher.join()
        during = [(t, n) for t, n in seen if t <= t1]
        grew = next((t - t0 for t, n in during if n > 1), None)
        row = {
            "items": args.items,
            "seconds": args.seconds,
            "max": args.max,
            "demand": args.demand,
            "linger": args.linger,
            "map_s": round(t1 - t0, 2),
            "second_worker_after_s": None if grew is None else round(grew, 2),
            "peak_workers": max(n for _, n in during),
            "back_to_1_after_s": None if back is None else round(back, 2),
            "one_thread_s": args.items * args.seconds,
        }
        print(json.dumps(row))
    finally:
        handle.close()


if __name__ == "__main__":
    main()
