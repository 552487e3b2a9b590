"""Does progress + telemetry slow a map?  A 10,000-item map with everything off vs. on.

    .venv/bin/python benchmarks/progress_overhead.py [--items 10000] [--repeat 5]

* off:     progress=False, no job messages, no metrics subscription, no flush plugin
* on:      progress bar (text renderer, written to a buffer), job messages on
           ``jupyter-cluster:jobs``, the kernel subscribed to metrics, flush plugin on
           the workers
* on+report: as "on", and every item also calls ``jupyter_cluster.report()``

Runs alternate (off, on, on+report, off, ...) on one 2-worker cluster so that
drifting machine load hits all variants alike; medians are compared.  Besides
wall time it sums the CPU time of the kernel process (client, scheduler,
progress thread) and of the worker processes, which a busy machine disturbs
far less than wall time.  The target is on/off <= 1.05.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import time


def work(x):
    s = 0
    for i in range(1000):
        s += i * x
    return s


def work_and_report(x):
    from jupyter_cluster import report

    s = work(x)
    report(step=x, topic="bench", loss=float(s % 97))
    return s


def _worker_cpu() -> float:
    import psutil

    t = psutil.Process().cpu_times()
    return t.user + t.system


def _cpu(client) -> float:
    """CPU seconds used so far by this process and by every worker process."""
    return time.process_time() + sum(client.run(_worker_cpu).values())


def _has_plugin(dask_scheduler=None) -> bool:
    from jupyter_cluster.telemetry import PLUGIN_NAME

    return PLUGIN_NAME in dask_scheduler.worker_plugins


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()

    import dask

    import jupyter_cluster as jc
    from jupyter_cluster import mapping
    from jupyter_cluster import telemetry as tm
    from jupyter_cluster.telemetry import hub as hub_module
    from jupyter_cluster.tracking import progress

    handle = jc.start(workers=args.workers, threads=1)
    client = handle.client
    progress.set_renderer("text")
    times: dict[str, list[float]] = {"off": [], "on": [], "on+report": []}
    cpus: dict[str, list[float]] = {"off": [], "on": [], "on+report": []}

    def telemetry(on: bool) -> None:
        hub = hub_module._hubs.pop(client.id, None)
        if hub is not None:
            hub.detach()
        if client.run_on_scheduler(_has_plugin):
            client.unregister_worker_plugin(tm.PLUGIN_NAME)
        if on:
            tm.attach(client)

    try:
        mapping.map(work, range(200), progress=False)  # warm up the workers
        for _ in range(args.repeat):
            for variant in ("off", "on", "on+report"):
                on = variant != "off"
                telemetry(on)
                fn = work_and_report if variant == "on+report" else work
                sink = io.StringIO()
                with dask.config.set({"jupyter-cluster.progress.publish": on}), contextlib.redirect_stdout(sink):
                    c0 = _cpu(client)
                    t0 = time.perf_counter()
                    out = mapping.map(fn, range(args.items), progress=True if on else False)
                    times[variant].append(time.perf_counter() - t0)
                    if on:  # the last job message and reports are sent within ~0.5 s
                        time.sleep(0.6)
                    cpus[variant].append(_cpu(client) - c0)
                assert len(out) == args.items
                if on:
                    assert progress.recent[-1].shown
        st = tm.store("bench")
    finally:
        handle.close()

    off, off_min = statistics.median(times["off"]), min(times["off"])
    print(f"{args.items:,}-item map on {args.workers} workers, {args.repeat} runs each (alternating)")
    for variant, ts in times.items():
        med = statistics.median(ts)
        print(
            f"  {variant:<10} median {med:6.3f} s (x{med / off:5.3f})   best {min(ts):6.3f} s (x{min(ts) / off_min:5.3f})"
            f"   runs: {', '.join(f'{t:.3f}' for t in ts)}"
        )
    print(f"  reports received by the kernel (on+report): {st.received:,}, dropped {st.dropped}")
    cpu_off = statistics.median(cpus["off"])
    for variant, cs in cpus.items():
        med = statistics.median(cs)
        print(f"  {variant:<10} CPU (kernel + workers) median {med:6.3f} s (x{med / cpu_off:5.3f})")
    ratio = statistics.median(times["on"]) / off
    best = min(times["on"]) / off_min
    cpu_ratio = statistics.median(cpus["on"]) / cpu_off
    print(
        f"progress + telemetry overhead: wall median {100 * (ratio - 1):+.1f} %, wall best-of {100 * (best - 1):+.1f} %, "
        f"CPU {100 * (cpu_ratio - 1):+.1f} % (target <= +5 %)"
    )


if __name__ == "__main__":
    main()
