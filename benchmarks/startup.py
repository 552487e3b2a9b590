"""How long a cluster takes to start: jupyter_cluster, plain Dask and multiprocessing, side by side.

Every sample runs in a fresh interpreter (a child of this script), so a
"first start" pays what a new kernel pays; a "second start" is the next one in
the same process.  Cases, for each ``--workers`` N:

* ``jc``: ``jupyter_cluster.start(workers=N)`` until N workers are connected
  (TLS, credentials, registry record, worker plugins: the defaults), first and
  second start, with the first start's phases (scheduler made, worker processes
  up, client connected, plugins registered), then the first result of a
  one-item ``jc.map`` (what Run All does);
* ``jc spawn``: the same with ``jupyter-cluster.local.forkserver: false``
  (each worker a freshly spawned interpreter, as Dask does by default);
* ``jc after load_ext``: the same right after the background import that
  ``%load_ext jupyter_cluster`` begins (cells run back to back, nobody typing);
* ``dask``: ``distributed.LocalCluster(n_workers=N, threads_per_worker=1)`` and
  a ``Client`` until N workers are connected (plain TCP, Dask's defaults), then
  the first result of one ``client.submit``;
* ``mp fork`` / ``mp spawn``: ``multiprocessing.Pool(N)`` until a map of N
  one-item chunks has returned;
* ``kernel``: ``%cluster start --workers N`` as the first cell after
  ``%load_ext jupyter_cluster`` in a real IPython kernel (jupyter_client),
  timed from the client (request sent to reply received).

The ``total`` column is the issue-28 figure: from ``import`` to the first
result, right after the first start (import + first start + first result).
Prints medians and ratios, and with ``--record`` writes
``benchmarks/results/startup-<date>T<HHMM>Z-<machine>.{json,md}``.  Load
averages are recorded: the numbers mean little on a busy machine.  Run::

    python benchmarks/startup.py [--workers 2,4,8] [--repeat 5] [--record] [--machine vm2cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


# -- children: one fresh interpreter per sample --------------------------------
class _AfterImport:
    """A ``sys.meta_path`` finder that runs ``hooks[name](module)`` once module ``name`` is imported.

    The phases are hooked without importing anything before the start: the
    start's own imports (distributed, the session) stay in its time, as in a
    notebook.
    """

    def __init__(self, hooks: dict):
        self.hooks = dict(hooks)

    def find_spec(self, name, path=None, target=None):
        import importlib.util

        hook = self.hooks.pop(name, None)
        if hook is None:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            if self.hooks:
                sys.meta_path.insert(0, self)
        loader = spec.loader

        class Loader:
            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                loader.exec_module(module)
                hook(module)

        spec.loader = Loader()
        return spec


def _phases() -> tuple[list[tuple[str, float]], float]:
    """Hook the steps of a start to record when each ends (seconds from the returned origin)."""
    import functools

    marks: list[tuple[str, float]] = []
    t0 = time.perf_counter()

    def after(owner, name, label):
        fn = getattr(owner, name)

        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            finally:
                marks.append((label, time.perf_counter()))

        setattr(owner, name, wrapped)

    def after_async(owner, name, label):
        fn = getattr(owner, name)

        @functools.wraps(fn)
        async def wrapped(*args, **kwargs):
            try:
                return await fn(*args, **kwargs)
            finally:
                marks.append((label, time.perf_counter()))

        setattr(owner, name, wrapped)

    hooks = {
        "distributed.scheduler": lambda m: after(m.Scheduler, "__init__", "scheduler made"),
        "distributed.deploy.spec": lambda m: after_async(
            m.SpecCluster, "_correct_state_internal", "worker processes up (forked or spawned, imports, handshakes)"
        ),
        "jupyter_cluster.backends.local.backend": lambda m: after(
            m.LocalBackend, "start", "cluster made (dashboard on its socket, link)"
        ),
        "distributed.client": lambda m: after(m.Client, "register_plugin", "a worker plugin registered"),
        "jupyter_cluster.cluster.session": lambda m: (
            marks.append(("distributed and the session imported", time.perf_counter())),
            after(m, "connect_client", "client connected"),
            after(m, "_adopt", "registry record written, control listener"),
        ),
    }
    sys.meta_path.insert(0, _AfterImport(hooks))
    return marks, t0


def _child_jc(workers: int, load_ext: bool, forkserver: bool = True) -> dict:
    t0 = time.perf_counter()
    import jupyter_cluster as jc

    if not forkserver:
        import dask.config

        dask.config.set({"jupyter-cluster.local.forkserver": False})

    imported = time.perf_counter() - t0
    if load_ext:  # what %load_ext begins (besides its magics)
        from jupyter_cluster._core import background as _background
        from jupyter_cluster.backends.local.forkserver import start_early

        start_early(None, {})
        _background.start()
    marks, origin = _phases() if not load_ext else ([], 0.0)
    out = {"import": imported}
    for key in ("first", "second"):
        t0 = time.perf_counter()
        handle = jc.start(workers=workers, name=f"startup-bench-{os.getpid()}-{key}")
        handle.wait_for_workers(workers)
        out[key] = time.perf_counter() - t0
        if key == "first":
            t1 = time.perf_counter()
            assert jc.map(abs, [-1]) == [1]
            out["first_result"] = time.perf_counter() - t1
            out["total"] = imported + out["first"] + out["first_result"]
        if key == "first" and marks:
            ended: dict[str, float] = {}  # a step run twice (SpecCluster checks its workers again): its first end
            for label, t in marks:
                if t >= t0:
                    ended.setdefault(label, t - t0)
            out["phases"] = list(ended.items())
        handle.close()
    return out


def _child_dask(workers: int) -> dict:
    t0 = time.perf_counter()
    import distributed

    out = {"import": time.perf_counter() - t0}
    for key in ("first", "second"):
        t0 = time.perf_counter()
        cluster = distributed.LocalCluster(n_workers=workers, threads_per_worker=1, dashboard_address=":0")
        client = distributed.Client(cluster)
        client.wait_for_workers(workers)
        out[key] = time.perf_counter() - t0
        if key == "first":
            t1 = time.perf_counter()
            assert client.submit(abs, -1).result() == 1
            out["first_result"] = time.perf_counter() - t1
            out["total"] = out["import"] + out["first"] + out["first_result"]
        client.close()
        cluster.close()
    return out


def _child_mp(workers: int, method: str) -> dict:
    import multiprocessing

    ctx = multiprocessing.get_context(method)
    out = {"import": 0.0}
    for key in ("first", "second"):
        t0 = time.perf_counter()
        with ctx.Pool(workers) as pool:
            pool.map(abs, range(workers), chunksize=1)
            out[key] = time.perf_counter() - t0
        if key == "first":
            out["total"] = out[key]
    return out


def _child_kernel(workers: int) -> dict:
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    try:
        times = {}
        for key, code in (
            ("load_ext", "%load_ext jupyter_cluster"),
            ("first", f"%cluster start --workers {workers}"),
            ("check", "import jupyter_cluster as jc; assert len(jc.current().client.nthreads()) >= 1"),
        ):
            errors: list[str] = []

            def keep(msg, errors=errors):
                if msg["msg_type"] == "error":
                    errors.append(msg["content"]["evalue"])

            t0 = time.perf_counter()
            reply = kc.execute_interactive(code, timeout=120, output_hook=keep)
            times[key] = time.perf_counter() - t0
            if reply["content"]["status"] != "ok":
                raise RuntimeError(f"{code!r} failed in the kernel: {errors}")
        kc.execute_interactive("%cluster stop", timeout=60)
        return {"import": times["load_ext"], "first": times["first"]}
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def _child(case: str, workers: int) -> dict:
    if case == "jc":
        return _child_jc(workers, load_ext=False)
    if case == "jc after load_ext":
        return _child_jc(workers, load_ext=True)
    if case == "jc spawn":
        return _child_jc(workers, load_ext=False, forkserver=False)
    if case == "dask":
        return _child_dask(workers)
    if case.startswith("mp "):
        return _child_mp(workers, case.split()[1])
    if case == "kernel":
        return _child_kernel(workers)
    raise SystemExit(f"unknown case {case!r}")


# -- parent ---------------------------------------------------------------------------
CASES = ("jc", "jc spawn", "jc after load_ext", "kernel", "dask", "mp fork", "mp spawn")


def _sample(case: str, workers: int, registry_dir: str) -> dict:
    env = dict(os.environ, DASK_JUPYTER_CLUSTER__REGISTRY_DIR=registry_dir)
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", case, "--workers", str(workers)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{case} with {workers} workers failed:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", default="2", help="worker counts, comma-separated (e.g. 2,4,8)")
    ap.add_argument("--repeat", type=int, default=5, help="fresh interpreters per case and worker count")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, from: {', '.join(CASES)}")
    ap.add_argument("--record", action="store_true", help="write the results under benchmarks/results/")
    ap.add_argument("--machine", default=f"vm{os.cpu_count()}cpu", help="machine label for the results file name")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    counts = [int(w) for w in args.workers.split(",")]
    if args.child:
        print(json.dumps(_child(args.child, counts[0])))
        return 0
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {', '.join(unknown)}; choose from: {', '.join(CASES)}")
    load_before = os.getloadavg()
    started = time.gmtime()
    rows = []
    with tempfile.TemporaryDirectory(prefix="jc-startup-") as registry_dir:
        for workers in counts:
            samples: dict[str, list[dict]] = {c: [] for c in cases}
            for _ in range(args.repeat):  # interleaved, so a burst of load hits every case alike
                for case in cases:
                    samples[case].append(_sample(case, workers, registry_dir))
            for case in cases:
                got = samples[case]
                phases = [s["phases"] for s in got if "phases" in s]
                rows.append(
                    {
                        "case": case,
                        "workers": workers,
                        "import_s": _median([s.get("import") for s in got]),
                        "first_s": _median([s["first"] for s in got]),
                        "second_s": _median([s.get("second") for s in got]),
                        "first_result_s": _median([s.get("first_result") for s in got]),
                        "total_s": _median([s.get("total") for s in got]),
                        "total_all_s": [round(s["total"], 3) for s in got if s.get("total") is not None],
                        "first_best_s": min(s["first"] for s in got),
                        "first_all_s": [round(s["first"], 3) for s in got],
                        "phases_s": [
                            (label, round(_median([p[i][1] for p in phases if len(p) > i]), 3))
                            for i, (label, _) in enumerate(phases[0])
                        ]
                        if phases
                        else None,
                    }
                )
            print(_table([r for r in rows if r["workers"] == workers]), flush=True)
    load_after = os.getloadavg()
    header = (
        f"{time.strftime('%Y-%m-%d %H:%M UTC', started)}, {os.cpu_count()} CPUs, commit {_commit()}, "
        f"median of {args.repeat} fresh interpreters, load average {load_before[0]:.2f} → {load_after[0]:.2f}"
    )
    print(header)
    if args.record:
        stem = os.path.join(HERE, "results", f"startup-{time.strftime('%Y-%m-%dT%H%MZ', started)}-{args.machine}")
        with open(stem + ".json", "w") as f:
            json.dump({"header": header, "load": [load_before, load_after], "rows": rows}, f, indent=1)
        with open(stem + ".md", "w") as f:
            f.write(
                header + "\n\n" + "\n\n".join(_table([r for r in rows if r["workers"] == w]) for w in counts) + "\n"
            )
        print(f"wrote {stem}.json and .md")
    return 0


def _fmt(v) -> str:
    return "–" if v is None else f"{v:.3f}"


def _table(rows: list[dict]) -> str:
    by_case = {r["case"]: r for r in rows}
    workers = rows[0]["workers"]
    lines = [
        f"**{workers} workers** (seconds, medians; best = the fastest sample, the least disturbed by other load; "
        "ratios of medians to plain Dask's and to multiprocessing fork's first start)",
        "",
        "| case | import | first start | best first | second start | first / dask | first / mp fork | samples (first) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    dask = by_case.get("dask", {}).get("first_s")
    mp = by_case.get("mp fork", {}).get("first_s")
    for r in rows:
        ratio_d = f"{r['first_s'] / dask:.2f}" if dask else "–"
        ratio_m = f"{r['first_s'] / mp:.0f}" if mp else "–"
        lines.append(
            f"| {r['case']} | {_fmt(r['import_s'])} | {_fmt(r['first_s'])} | {_fmt(r['first_best_s'])} | {_fmt(r['second_s'])} | "
            f"{ratio_d} | {ratio_m} | {', '.join(f'{v:.2f}' for v in r['first_all_s'])} |"
        )
    dask_total = by_case.get("dask", {}).get("total_s")
    lines += [
        "",
        f"**From `import` to the first result** right after the first start, {workers} workers (medians, s)",
        "",
        "| case | import | first start | first result | total | total / dask | samples (total) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.get("total_s") is None:
            continue
        ratio_t = f"{r['total_s'] / dask_total:.2f}" if dask_total else "–"
        lines.append(
            f"| {r['case']} | {_fmt(r['import_s'])} | {_fmt(r['first_s'])} | {_fmt(r.get('first_result_s'))} | "
            f"**{_fmt(r['total_s'])}** | {ratio_t} | {', '.join(f'{v:.2f}' for v in r.get('total_all_s') or [])} |"
        )
    for r in rows:
        if r["phases_s"]:
            lines += [
                "",
                f"`{r['case']}` first start, {workers} workers: when each step ended (median s from the call)",
                "",
            ]
            lines += [f"- {t:.3f} s: {label}" for label, t in r["phases_s"]]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
