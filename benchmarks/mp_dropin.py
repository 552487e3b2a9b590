"""``jupyter_cluster.multiprocessing`` as a drop-in: beside ``multiprocessing`` and plain Dask, in one run.

Two figures of issue 36:

- a map of 10^6 trivial items with each system's *default* chunking, on a
  running 2-worker cluster / 2-process pool (``multiprocessing``:
  ``chunksize = len / (4 x processes)``; ours: ``chunksize=None``; plain
  Dask: ``client.map`` over the chunks ``multiprocessing`` cuts, on a ``LocalCluster`` of its own):
  the median wall time of ``--repeat`` maps, ``multiprocessing`` and ours taking turns, and the CPU
  time of each pool's processes (this one and its workers: robust to the machine's load);
- a script's first ``Pool`` result, from a fresh interpreter's start
  (import, cluster or pool start, one ``apply``), for each system: each snippet
  is run as a script file, as users run them (spawned and fork-served worker
  processes import a file script again; ``python -c`` has none), best of
  ``--first-runs`` runs, the systems taking turns.

Run::

    python benchmarks/mp_dropin.py [--items 1000000] [--repeat 3] [--first-runs 3]
        [--first-only] [--no-dask-map] [--before OTHER_TREE]

``--before`` adds a row for ``jupyter_cluster`` imported from another checkout
(``git worktree add /tmp/before <commit>``): before and after in one run.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import time


def inc(x):
    return x + 1


def _run_chunk(chunk):
    return [inc(x) for x in chunk]


FIRST_RESULT = {
    "multiprocessing": (
        "import time; t0 = time.perf_counter()\n"
        "import multiprocessing as mp\n"
        "def f(x): return x + 1\n"
        "if __name__ == '__main__':\n"
        "    with mp.Pool(2) as p: p.apply(f, (1,))\n"
        "    print(time.perf_counter() - t0)\n"
    ),
    "jupyter_cluster.multiprocessing": (
        "import time; t0 = time.perf_counter()\n"
        "import jupyter_cluster.multiprocessing as mp\n"
        "def f(x): return x + 1\n"
        "if __name__ == '__main__':\n"
        "    with mp.Pool(2) as p: p.apply(f, (1,))\n"
        "    print(time.perf_counter() - t0)\n"
    ),
    "dask LocalCluster": (
        "import time; t0 = time.perf_counter()\n"
        "from distributed import Client, LocalCluster\n"
        "def f(x): return x + 1\n"
        "if __name__ == '__main__':\n"
        "    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as c, Client(c) as cl:\n"
        "        cl.submit(f, 1).result()\n"
        "        print(time.perf_counter() - t0)\n"
    ),
}


def first_result(code: str, folder: str, pythonpath: str | None = None) -> float:
    """Seconds from a fresh interpreter's start to ``code``'s first result, ``code`` run as a script file."""
    script = os.path.join(folder, "first_result_script.py")  # a name no imported module has
    with open(script, "w") as f:
        f.write(code)
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    out = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=300, env=env, cwd=folder)
    lines = [line for line in out.stdout.splitlines() if line and not line.startswith("Started cluster")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(out.stderr[-2000:])
    return float(lines[-1])


def first_results(runs: int, before: str | None) -> dict[str, float]:
    """Best of ``runs`` first-result times per system, the systems taking turns (a load spike hits them alike)."""
    import tempfile

    snippets = dict(FIRST_RESULT)
    trees: dict[str, str | None] = {name: None for name in snippets}
    if before is not None:
        name = f"jupyter_cluster.mp ({os.path.basename(before.rstrip('/'))})"
        snippets[name] = FIRST_RESULT["jupyter_cluster.multiprocessing"]
        trees[name] = before
    best = {name: float("inf") for name in snippets}
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(runs):
            for name, code in snippets.items():
                best[name] = min(best[name], first_result(code, folder, trees[name]))
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--first-runs", type=int, default=3, help="runs of each first-result script (best taken)")
    ap.add_argument("--first-only", action="store_true", help="measure only the first results, not the map")
    ap.add_argument("--before", help="another checkout's root: its first result too, beside this one's")
    ap.add_argument("--no-dask-map", action="store_true", help="leave plain Dask out of the map (about a minute)")
    args = ap.parse_args()
    if not args.first_only:
        _maps(args)
    print(f"a script's first Pool result, from interpreter start (best of {args.first_runs}):")
    firsts = first_results(args.first_runs, args.before)
    for name, seconds in firsts.items():
        print(f"  {name:<32} {seconds:7.3f} s   x{seconds / firsts['multiprocessing']:6.1f} of multiprocessing")


def _maps(args: argparse.Namespace) -> None:
    import statistics

    import psutil

    items = list(range(args.items))
    rows: dict[str, float] = {}
    cpu: dict[str, float] = {}
    mp_name, jc_name = "multiprocessing.Pool(2).map", "jupyter_cluster Pool().map"
    times: dict[str, list[float]] = {mp_name: [], jc_name: []}
    cpus: dict[str, list[float]] = {mp_name: [], jc_name: []}

    import jupyter_cluster as jc

    # Both pools run at once and take turns, map by map: a load spike from the machine's other users
    # hits them alike (the ratio is taken pair by pair).  CPU: this process and the pool's workers.
    with multiprocessing.Pool(2) as mp_pool:
        mp_pool.map(inc, range(100))
        children = psutil.Process().children()
        handle = jc.start(workers=2, threads=1)
        try:
            with jc.Pool() as pool:
                pool.map(inc, range(100))
                pool.map(inc, items)  # the engine's first map of the function measures its items

                def workers_cpu() -> float:
                    return sum(handle.client.run(time.process_time).values())

                for _ in range(args.repeat):
                    for name, run, others in (
                        (
                            mp_name,
                            lambda: mp_pool.map(inc, items),
                            lambda: sum(sum(c.cpu_times()[:2]) for c in children),
                        ),
                        (jc_name, lambda: pool.map(inc, items), workers_cpu),
                    ):
                        c0, o0 = time.process_time(), others()
                        times[name].append(_timed(run))
                        cpus[name].append(time.process_time() - c0 + others() - o0)
        finally:
            handle.close()
    for name in (mp_name, jc_name):
        rows[name] = statistics.median(times[name])
        cpu[name] = statistics.median(cpus[name])
    pairs = [b / a for a, b in zip(times[mp_name], times[jc_name])]
    print(
        f"  (jc / mp pair by pair: median x{statistics.median(pairs):.2f}, range x{min(pairs):.2f}-x{max(pairs):.2f})"
    )
    if args.no_dask_map:
        _print_maps(args, rows, cpu)
        return

    # Plain Dask on a cluster of its own: on ours, idle map leases would hold the threads its tasks need.
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster, Client(cluster) as client:
        client.submit(inc, 1).result()

        size = max(1, -(-len(items) // (4 * 2)))

        def dask_map():
            futures = client.map(_run_chunk, [items[i : i + size] for i in range(0, len(items), size)], pure=False)
            return [x for part in client.gather(futures) for x in part]

        rows["dask client.map (mp's chunks)"] = statistics.median(_timed(dask_map) for _ in range(args.repeat))
    _print_maps(args, rows, cpu)


def _print_maps(args: argparse.Namespace, rows: dict[str, float], cpu: dict[str, float]) -> None:
    base = rows["multiprocessing.Pool(2).map"]
    print(f"map of {args.items:,} trivial items, default chunking, median of {args.repeat} (2 workers / processes):")
    for name, seconds in rows.items():
        used = f"   CPU {cpu[name]:.3f} s" if name in cpu else ""
        print(f"  {name:<32} {seconds:7.3f} s   x{seconds / base:5.2f} of multiprocessing{used}")


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
