"""What 100 series x 10,000 points cost in the kernel and on the wire to the browser.

    .venv/bin/python benchmarks/metrics_model.py [--series 100] [--points 10000]

Fills a TopicStore the way reports arrive (batches per producer), then times
the downsampled chart model (first build, a rebuild after one new point per
series, and a rebuild with nothing new) and the JSON size a widget update sends.
"""

from __future__ import annotations

import argparse
import json
import time

from jupyter_cluster import telemetry


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--series", type=int, default=100)
    ap.add_argument("--points", type=int, default=10_000)
    args = ap.parse_args()
    st = telemetry.TopicStore("bench", history=args.series * args.points)
    t0 = time.perf_counter()
    for m in range(args.series):
        recs = [
            {"step": s, "time": 0.0, "series": {"member": m}, "values": {"reward": (s * 7919 % 1000) / 1000}}
            for s in range(args.points)
        ]
        for i in range(0, args.points, 1000):
            st.add(f"p{m}", i, recs[i : i + 1000])
    ingest = time.perf_counter() - t0
    n = args.series * args.points
    t0 = time.perf_counter()
    model = st.model()
    first = time.perf_counter() - t0
    for m in range(args.series):
        st.add(
            f"p{m}",
            args.points,
            [{"step": args.points, "time": 0.0, "series": {"member": m}, "values": {"reward": 0.5}}],
        )
    t0 = time.perf_counter()
    model = st.model()
    again = time.perf_counter() - t0
    t0 = time.perf_counter()
    st.model()
    cached = time.perf_counter() - t0
    payload = json.dumps(model)
    points = sum(len(p) for p in model["scalars"]["reward"].values())
    print(f"{args.series} series x {args.points:,} points = {n:,} reports")
    print(f"  ingest: {ingest:.2f} s ({ingest / n * 1e6:.1f} us per report)")
    print(
        f"  chart model: first {first * 1000:.0f} ms, after 1 new point per series {again * 1000:.0f} ms, unchanged {cached * 1000:.1f} ms"
    )
    print(f"  sent to the browser: {points:,} points, {len(payload) / 1e6:.2f} MB JSON per update")


if __name__ == "__main__":
    main()
