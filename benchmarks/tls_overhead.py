"""What TLS costs a map: the same work on a plain-TCP and a TLS local cluster.

Two shapes of work, each timed on both clusters from one run:

* many tiny items (per-message overhead: handshakes are once per connection,
  so this is mostly encryption of small frames and extra syscalls);
* fewer items carrying 1 MiB each way (bulk encryption throughput).

Prints seconds per configuration and the TLS/TCP ratio.  Usage::

    python benchmarks/tls_overhead.py [--workers 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time


def _tiny(x):
    return x + 1


def _bulk(payload):
    return payload[::-1]


def _run(client, fn, items) -> float:
    from jupyter_cluster import mapping

    t0 = time.perf_counter()
    out = mapping.map(fn, items, client=client, progress=False)
    assert len(out) == len(items)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tiny", type=int, default=2000, help="number of tiny items")
    parser.add_argument("--bulk", type=int, default=64, help="number of 1 MiB items")
    args = parser.parse_args()

    import jupyter_cluster as jc

    workloads = {
        f"{args.tiny} tiny items": (_tiny, list(range(args.tiny))),
        f"{args.bulk} x 1 MiB items": (_bulk, [bytes([i % 256]) * 2**20 for i in range(args.bulk)]),
    }
    # Both clusters stay up and runs alternate, so a busy machine slows both alike.
    handles = {label: jc.start(workers=args.workers, threads=1, tls=tls, name=f"bench-{label}")
               for label, tls in (("tcp", False), ("tls", True))}
    times: dict[str, dict[str, list[float]]] = {name: {"tcp": [], "tls": []} for name in workloads}
    try:
        for name, (fn, items) in workloads.items():
            for handle in handles.values():  # warm-up: connections, imports, pickled function
                _run(handle.client, fn, items[: max(1, len(items) // 10)])
            for _ in range(args.repeats):
                for label, handle in handles.items():
                    times[name][label].append(_run(handle.client, fn, items))
    finally:
        for handle in handles.values():
            handle.close()
    results = {name: {label: (min(t), statistics.median(t)) for label, t in by.items()} for name, by in times.items()}

    print(f"TLS overhead, {args.workers} local workers, best (median) of {args.repeats}")
    print(f"{'workload':<24} {'tcp s':>14} {'tls s':>14} {'tls/tcp':>8}")
    for name, by in results.items():
        (tcp_best, tcp_med), (tls_best, tls_med) = by["tcp"], by["tls"]
        print(f"{name:<24} {tcp_best:>6.3f} ({tcp_med:.3f}) {tls_best:>6.3f} ({tls_med:.3f}) {tls_best / tcp_best:>8.2f}")


if __name__ == "__main__":
    main()
