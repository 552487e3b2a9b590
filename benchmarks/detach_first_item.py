"""Time from a ``%%parallel`` cell's start to its first item running: ``--detach`` against the same cell.

One IPython shell, one kept local cluster (2 workers), the two cells alternated
``--repeat`` times; each item notes ``time.time()`` when it starts.  Prints the
medians and their ratio.  ``PYTHONPATH=$PWD python benchmarks/detach_first_item.py``
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    store = tempfile.mkdtemp(prefix="jc-detach-bench-")
    os.environ["DASK_JUPYTER_CLUSTER__DETACHED__STORE_DIR"] = os.path.join(store, "jobs")
    import dask.config
    from IPython.testing.globalipapp import start_ipython

    dask.config.set({"jupyter-cluster.detached.store-dir": os.path.join(store, "jobs")})
    ip = start_ipython()
    ip.run_line_magic("load_ext", "jupyter_cluster")
    ip.run_line_magic("cluster", "start --keep --workers 2 --name bench-detach --idle-timeout 60")
    marks = os.path.join(store, "marks")
    os.mkdir(marks)
    ip.user_ns["marks"] = marks
    body = "import os, time\nopen(os.path.join(marks, f'{run}-{x}'), 'w').write(repr(time.time()))\nx"
    times: dict[str, list[float]] = {"attached": [], "detached": []}
    for i in range(args.repeat):
        for kind in ("attached", "detached"):
            run = f"{kind}{i}"
            ip.user_ns["run"] = run
            detach = f" --detach job{i}" if kind == "detached" else ""
            t0 = time.time()
            ip.run_cell_magic("parallel", f"x in range(4) --no-progress{detach}", body)
            deadline = time.monotonic() + 60
            while not any(e.startswith(run + "-") for e in os.listdir(marks)) and time.monotonic() < deadline:
                time.sleep(0.002)
            time.sleep(0.3)
            first = min(
                float(open(os.path.join(marks, e)).read()) for e in os.listdir(marks) if e.startswith(run + "-")
            )
            times[kind].append(first - t0)
            if kind == "detached":
                import jupyter_cluster as jc

                jc.job(f"job{i}").wait(30)
    ip.run_line_magic("cluster", "stop bench-detach")
    a, d = statistics.median(times["attached"]), statistics.median(times["detached"])
    print(
        f"first item running, median of {args.repeat}: %%parallel {a * 1000:.0f} ms, --detach {d * 1000:.0f} ms, ratio {d / a:.2f}"
    )
    print("all (s):", {k: [round(v, 3) for v in vs] for k, vs in times.items()})


if __name__ == "__main__":
    main()
