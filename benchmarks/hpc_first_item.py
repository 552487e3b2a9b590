"""SLURM beside local, in one run: start-to-first-item, and the 1 ms map's efficiency.

For each repetition (the order of the two backends alternates, so drift on a
shared machine hits both alike):

* start-to-first-item: ``jupyter_cluster.start(backend=B, workers=W)``, then a
  one-item map; the time from just before the start to its result.  For SLURM
  that includes writing and submitting W job scripts (``sbatch``), slurmd
  starting them, and ``dask worker`` connecting back over TLS.
* the 1 ms map: an untimed warm-up map (2 items per worker), then ``--items``
  items of ``time.sleep(0.001)`` through ``jupyter_cluster.map``;
  ideal = serial item time (measured here first) x items / W; efficiency =
  ideal / wall.

Needs a SLURM whose commands work here (``SLURM_CONF``), e.g. the tests' own::

    bash tests/hpc/start-slurm.sh /tmp/jcslurm 2     # as root: munge, slurmctld, 2 slurmd nodes
    SLURM_CONF=/tmp/jcslurm/slurm.conf python benchmarks/hpc_first_item.py [--workers 2] [--reps 3] [--items 2000]
    bash tests/hpc/stop-slurm.sh /tmp/jcslurm
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def sleep_1ms(_: int) -> None:
    time.sleep(0.001)


def serial_item_s(n: int = 500) -> float:
    t = time.perf_counter()
    for i in range(n):
        sleep_1ms(i)
    return (time.perf_counter() - t) / n


def one(backend: str, workers: int, items: int, options: dict) -> dict:
    import jupyter_cluster as jc

    t0 = time.perf_counter()
    handle = jc.start(backend=backend, workers=workers, threads=1, **options)
    try:
        jc.map(abs, [1], client=handle, progress=False)
        first_item = time.perf_counter() - t0
        handle.wait_for_workers(workers, timeout=300)
        jc.map(sleep_1ms, range(2 * workers), client=handle, progress=False)  # warm-up
        per_item = serial_item_s()
        t = time.perf_counter()
        jc.map(sleep_1ms, range(items), client=handle, progress=False)
        wall = time.perf_counter() - t
    finally:
        handle.close()
    ideal = per_item * items / workers
    return {"first_item_s": first_item, "wall_s": wall, "ideal_s": ideal, "efficiency": ideal / wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--items", type=int, default=2000)
    ap.add_argument("--walltime", default="00:10:00")
    ap.add_argument("--memory", default="500MiB", help="per SLURM job")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args()
    if not os.environ.get("SLURM_CONF") and not os.path.exists("/etc/slurm/slurm.conf"):
        raise SystemExit("no SLURM here: set SLURM_CONF (see this script's docstring)")
    backends = {
        "local": {},
        "slurm": {"walltime": args.walltime, "memory_limit": args.memory},
    }
    rows: dict[str, list[dict]] = {b: [] for b in backends}
    for rep in range(args.reps):
        order = list(backends) if rep % 2 == 0 else list(reversed(backends))
        for b in order:
            r = one(b, args.workers, args.items, backends[b])
            rows[b].append(r)
            print(
                f"rep {rep} {b:<6} start-to-first-item {r['first_item_s']:6.2f} s   "
                f"1 ms map: {r['wall_s']:.2f} s, efficiency {r['efficiency']:.0%}",
                flush=True,
            )
    summary = {
        b: {
            "first_item_s_median": statistics.median(r["first_item_s"] for r in rs),
            "efficiency_median": statistics.median(r["efficiency"] for r in rs),
            "runs": rs,
        }
        for b, rs in rows.items()
    }
    print(f"\nmedians over {args.reps} repetitions, {args.workers} workers, {args.items} items of 1 ms:")
    print(f"{'backend':<8} {'start-to-first-item':>20} {'1 ms map efficiency':>20}")
    for b, s in summary.items():
        print(f"{b:<8} {s['first_item_s_median']:>19.2f}s {s['efficiency_median']:>20.0%}")
    if args.out:
        meta = {
            "workers": args.workers,
            "items": args.items,
            "reps": args.reps,
            "date_utc": time.strftime("%Y-%m-%dT%H%MZ", time.gmtime()),
        }
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "results": summary}, f, indent=1)


if __name__ == "__main__":
    main()
