"""Quick efficiency check of the map engine (tuning aid; the peer benchmark lives elsewhere).

Efficiency = ideal time / measured time, where the ideal is the items' total
work divided by the number of worker threads.  Run::

    python benchmarks/quick_map.py [--workers 2] [--repeat 3]
"""

from __future__ import annotations

import argparse
import time


def sleep_item(t):
    time.sleep(t)
    return t


def cpu_item(t):
    end = time.thread_time() + t
    while time.thread_time() < end:
        pass
    return t


def noop(x):
    return x


def main() -> None:
    import jupyter_cluster as jc
    from jupyter_cluster import mapping

    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    handle = jc.start(workers=args.workers, threads=1)
    try:
        threads = handle.nthreads
        mapping.map(noop, range(100), client=handle)  # warm up imports on the workers
        cases = [
            ("1000 x sleep(1 ms)", sleep_item, [0.001] * 1000),
            ("200 x sleep(10 ms)", sleep_item, [0.01] * 200),
            ("400 x 10 ms CPU", cpu_item, [0.01] * 400),
        ]
        for name, fn, items in cases:
            best = 0.0
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                mapping.map(fn, items, client=handle)
                wall = time.perf_counter() - t0
                best = max(best, sum(items) / threads / wall)
                job = mapping.last_job()
            print(f"{name:<22} efficiency {best:6.1%}   ({job.chunks_submitted} tasks)")
        best = float("inf")
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            out = mapping.map(noop, range(100_000), client=handle)
            best = min(best, time.perf_counter() - t0)
            assert out[-1] == 99_999
        print(
            f"{'100000 x no-op':<22} {best / 100_000 * 1e6:6.2f} us per item ({mapping.last_job().chunks_submitted} tasks)"
        )
        gen_t0 = time.perf_counter()
        n = sum(1 for _ in mapping.imap(noop, (i for i in range(100_000)), client=handle))
        print(f"{'100000 x no-op (gen)':<22} {(time.perf_counter() - gen_t0) / n * 1e6:6.2f} us per item")
    finally:
        handle.close()


if __name__ == "__main__":
    main()
