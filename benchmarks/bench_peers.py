"""jupyter_cluster against its peers: the same workloads, one run, ratios.

Systems (``--systems``, comma separated):

=============== =================================================================
``mp``          ``multiprocessing.Pool(W).map(fn, items, chunksize=1)``
``mp+50``       the same with ``chunksize=50`` (hand-picked chunks)
``dask``        plain Dask: ``LocalCluster`` + ``client.map(fn, items, pure=False)``
``dask+50``     Dask with 50 items per task, chunked by hand
``ipp``         ipyparallel ``LoadBalancedView.map_sync`` (one item per task)
``fiber``       ``fiber.Pool(W).map(fn, items, chunksize=1)`` (needs ``--peer-python``)
``ray``         ``ray.util.multiprocessing.Pool(W)``, chunksize=1 (needs ``--peer-python``)
``jc-parallel`` ``%%parallel x in items`` through a real IPython shell
``jc-pool``     ``jupyter_cluster.Pool().map(fn, items)``
``jc-map``      ``jupyter_cluster.map(fn, items)``
``jc-map-tasks`` the same on the task path (``engine.path=tasks``: one Dask task per
                chunk, the engine before leases), for a side-by-side of the two paths
=============== =================================================================

jupyter_cluster runs with its defaults (``chunksize="auto"``), untuned.

Workloads (``--workloads``; ``--scale`` multiplies the item counts):
``noop`` 2,000 × identity; ``noop100k`` 100,000 × identity (skipped for a
system whose ``noop`` projects past ``--max-projected`` seconds);
``sleep1ms`` 1,000 × sleep 1 ms; ``sleep10ms`` 200 × sleep 10 ms;
``cpu10ms`` 400 × a 10 ms pure-Python loop; ``tail`` 500 sleeps with
lognormal durations (mean 10 ms, σ = 1.5: a few items last 20–50× the mean);
``bigarray`` 1,000 items reading a captured 100 MB array (transfers counted
by deserialisations in the worker processes); ``progress`` 10,000 × sleep
0.2 ms through ``jupyter_cluster.map`` with the progress widget and job
telemetry on vs off.

Method: one fresh child interpreter per (system, repetition); repetitions are
the outer loop and the order of systems rotates, so drift on a shared machine
hits every system alike.  Start-up = create the pool/cluster and get the first
result back; "first map" is that first one-item map alone (the session's cold
cost: connections, engine handlers, leases).  Each workload gets an untimed
warm-up map (2 items per worker).
ideal = (the item's serial duration, measured in the same child just before
the system starts) × items ÷ workers (for ``tail``: the larger of that and
the longest item); efficiency = ideal ÷ wall.  Ratios are taken within a
repetition, then the median over repetitions is reported.  Children run in a
private network namespace with only loopback when possible (``--netns``), and
every process a child leaves behind is reported and ended by its pid.

Run::

    python benchmarks/bench_peers.py                 # 5 repetitions, every available system
    python benchmarks/bench_peers.py --quick         # smoke run: 1 repetition, 1/10 of the items
    python benchmarks/bench_peers.py --systems mp,jc-map --workloads noop,sleep1ms --reps 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import workloads as wl  # noqa: E402  (after the path set-up above)
from peer_adapters import ALL_SYSTEMS, JC_SYSTEMS, PEER_VENV_SYSTEMS, Adapter, make_adapter  # noqa: E402
from peer_report import median, summarise, tables, targets  # noqa: E402

ALL_WORKLOADS = ["noop", "noop100k", "sleep1ms", "sleep10ms", "cpu10ms", "tail", "bigarray", "progress"]
# Which systems run which special workloads (the others run everywhere).
BIGARRAY_SYSTEMS = {"dask", "dask+50", *JC_SYSTEMS}
PROGRESS_SYSTEMS = {"jc-map"}
MARKER_ENV = "JC_BENCH_MARKER"
DEFAULT_PEER_PYTHON = "/tmp/anchors-venv/bin/python"


# =====================================================================================
# Child side: measuring
# =====================================================================================
def cpu_snapshot() -> tuple[float, dict]:
    """CPU seconds of this process, and of each descendant process by pid."""
    import psutil

    me = psutil.Process()
    t = me.cpu_times()
    rest = {}
    for p in me.children(recursive=True):
        try:
            c = p.cpu_times()
            rest[p.pid] = c.user + c.system
        except psutil.Error:
            pass
    return t.user + t.system, rest


def cpu_delta(before, after) -> dict:
    driver = after[0] - before[0]
    rest = sum(v - before[1].get(pid, 0.0) for pid, v in after[1].items())
    return {"driver_s": round(driver, 4), "rest_s": round(rest, 4)}


def serial_seconds(fn, items: list, k: int) -> float:
    """Mean duration of ``fn`` over the first ``k`` items, run here, one after another."""
    sample = items[:k]
    t0 = time.perf_counter()
    for x in sample:
        fn(x)
    return (time.perf_counter() - t0) / max(len(sample), 1)


def sleep_overshoot(k: int = 20) -> float:
    """How much longer than asked ``time.sleep(5 ms)`` takes here (the OS timer slack)."""
    t0 = time.perf_counter()
    for _ in range(k):
        time.sleep(0.005)
    return max((time.perf_counter() - t0) / k - 0.005, 0.0)


def build_workloads(cfg: dict) -> dict:
    """name -> (fn, items, ideal_s or None, expected results)."""
    s, w = cfg["scale"], cfg["workers"]
    n = lambda base: max(int(base * s), 4 * w)  # noqa: E731
    out = {}
    items = list(range(n(2000)))
    out["noop"] = (wl.identity, items, None, items)
    items = list(range(n(100_000)))
    out["noop100k"] = (wl.identity, items, None, items)
    for name, d, base in (("sleep1ms", 0.001, 1000), ("sleep10ms", 0.01, 200)):
        items = [d] * n(base)
        out[name] = (wl.sleep_item, items, None, items)
    items = [cfg["spin_loops"]] * n(400)
    out["cpu10ms"] = (wl.spin, items, None, items)
    items = wl.heavy_tailed_durations(n(500))
    out["tail"] = (wl.sleep_item, items, None, items)
    items = [0.0002] * n(10_000)
    out["progress"] = (wl.sleep_item, items, None, items)
    return out


def ideal_seconds(name: str, fn, items: list, workers: int, overshoot: float) -> float:
    if name in ("noop", "noop100k", "bigarray"):
        return 0.0
    if name == "tail":
        actual = [d + overshoot for d in items]
        return max(sum(actual) / workers, max(actual))
    k = {"sleep1ms": 50, "sleep10ms": 10, "cpu10ms": 10, "progress": 100}.get(name, 10)
    return serial_seconds(fn, items, k) * len(items) / workers


class Watchdog:
    """Ends this child (after writing what it has) when a stage runs past its limit."""

    def __init__(self, rec: dict, out_path: str):
        self.rec, self.out_path = rec, out_path
        self.timer: threading.Timer | None = None

    def arm(self, stage: str, seconds: float):
        self.disarm()
        self.timer = threading.Timer(seconds, self._fire, args=(stage, seconds))
        self.timer.daemon = True
        self.timer.start()

    def disarm(self):
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _fire(self, stage, seconds):
        self.rec["error"] = f"timeout: {stage} ran past {seconds:.0f} s"
        write_json(self.out_path, self.rec)
        os._exit(3)


def write_json(path: str, obj) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, default=str)
    os.replace(tmp, path)


def results_match(got, expected) -> bool:
    if len(got) != len(expected):
        return False
    return all(
        a == b or (isinstance(a, float) and abs(a - b) <= 1e-9 * max(1.0, abs(b))) for a, b in zip(got, expected)
    )


def child_main(system: str, cfg: dict, out_path: str) -> None:
    rec: dict = {"system": system, "rep": cfg["rep"], "ok": False, "workloads": {}, "skipped": {}}
    wd = Watchdog(rec, out_path)
    limit = cfg["stage_timeout"]
    workers = cfg["workers"]
    ad = None
    try:
        wls = build_workloads(cfg)
        overshoot = sleep_overshoot()
        rec["sleep_overshoot_s"] = overshoot
        ideals = {
            name: ideal_seconds(name, fn, items, workers, overshoot)
            for name, (fn, items, _, _) in wls.items()
            if name in cfg["workloads"]
        }
        ad = make_adapter(system, workers)
        rec["describe"] = ad.describe
        wd.arm("start-up", limit)
        t0 = time.perf_counter()
        ad.start()
        t1 = time.perf_counter()
        first = ad.map(wl.identity, [0])
        now = time.perf_counter()
        rec["startup_s"] = now - t0
        # The session's first map on its own (inside start-up): what a user's first cell pays on top
        # of a warm one (connections, engine handlers, leases), not the item's 0 s of work.
        rec["first_map_s"] = now - t1
        wd.disarm()
        if first != [0]:
            raise RuntimeError(f"first map returned {first!r}")
        if hasattr(ad, "cluster_start_s"):
            rec["cluster_start_s"] = ad.cluster_start_s
            rec["preload_s"] = ad.preload_s
        rec["versions"] = ad.versions()
        write_json(out_path, rec)

        for name in cfg["workloads"]:
            if name == "bigarray":
                if system not in BIGARRAY_SYSTEMS:
                    rec["skipped"][name] = "not measured for this system (it has no capture of notebook values)"
                    continue
                wd.arm(name, limit)
                rec["workloads"][name] = run_bigarray(ad, cfg)
                wd.disarm()
                write_json(out_path, rec)
                continue
            if name == "progress":
                if system not in PROGRESS_SYSTEMS:
                    rec["skipped"][name] = "measured on jc-map only"
                    continue
                wd.arm(name, 2 * limit)
                rec["workloads"][name] = run_progress(ad, wls[name], ideals[name])
                wd.disarm()
                write_json(out_path, rec)
                continue
            fn, items, _, expected = wls[name]
            if name == "noop100k" and "noop" in rec["workloads"]:
                projected = rec["workloads"]["noop"]["wall_s"] / len(wls["noop"][1]) * len(items)
                if projected > cfg["max_projected"]:
                    rec["skipped"][name] = (
                        f"would take about {projected:.0f} s (over --max-projected {cfg['max_projected']:.0f} s)"
                    )
                    continue
            wd.arm(f"warm-up of {name}", limit)
            ad.map(fn, items[: 2 * workers])
            cpu0 = cpu_snapshot()
            wd.arm(name, limit)
            t = time.perf_counter()
            res = ad.map(fn, items)
            wall = time.perf_counter() - t
            wd.disarm()
            ideal = ideals[name]
            rec["workloads"][name] = {
                "items": len(items),
                "wall_s": wall,
                "ideal_s": ideal,
                "efficiency": ideal / wall if ideal else None,
                "us_per_item": wall / len(items) * 1e6,
                # What the system adds per item on top of the work itself.
                "overhead_us_per_item": max(wall - ideal, 0.0) / len(items) * 1e6,
                "cpu": cpu_delta(cpu0, cpu_snapshot()),
                "correct": results_match(res, expected),
                "job": ad.last_job_stats,
            }
            write_json(out_path, rec)
        wd.arm("stop", limit)
        t = time.perf_counter()
        ad.stop()
        rec["stop_s"] = time.perf_counter() - t
        wd.disarm()
        ad = None
        wrong = [k for k, v in rec["workloads"].items() if v.get("correct") is False]
        rec["ok"] = not wrong
        if wrong:
            rec["error"] = "wrong results in: " + ", ".join(wrong)
    except BaseException as exc:  # noqa: BLE001 - record anything, then clean up
        wd.disarm()
        rec["error"] = f"{type(exc).__name__}: {exc}"
        rec["traceback"] = traceback.format_exc()[-4000:]
        if ad is not None:
            wd.arm("stop after an error", limit)
            try:
                ad.stop()
            except BaseException as exc2:  # noqa: BLE001
                rec["stop_error"] = f"{type(exc2).__name__}: {exc2}"
            wd.disarm()
    write_json(out_path, rec)


def run_bigarray(ad: Adapter, cfg: dict) -> dict:
    nbytes = int(cfg["big_mb"] * 1e6)
    count_path = os.path.join(cfg["scratch"], f"payload-{uuid.uuid4().hex[:8]}.count")
    payload = wl.Payload(nbytes, count_path)
    n = max(int(1000 * cfg["scale"]), 4 * cfg["workers"])
    items = list(range(n))
    size = len(payload.arr)
    expected = [float((i * 9973) % size) for i in items]
    cpu0 = cpu_snapshot()
    t = time.perf_counter()
    res = ad.map_big(payload, items)
    wall = time.perf_counter() - t
    cpu = cpu_delta(cpu0, cpu_snapshot())
    pids = wl.deserialisations(count_path)
    remote = [p for p in pids if p != os.getpid()]
    return {
        "items": n,
        "wall_s": wall,
        "array_mb": nbytes / 1e6,
        "deserialisations": len(remote),
        "processes": len(set(remote)),
        "mb_transferred": len(remote) * nbytes / 1e6,
        "transfers_per_worker": len(remote) / cfg["workers"],
        "us_per_item": wall / n * 1e6,
        "cpu": cpu,
        "correct": results_match(res, expected),
        "job": ad.last_job_stats,
    }


def run_progress(ad: Adapter, workload: tuple, ideal: float) -> dict:
    fn, items, _, expected = workload
    # Warm up both modes: the first map with the widget on imports ipywidgets,
    # a one-time cost that a notebook pays once (or never: %load_ext imports
    # it in the background), not per map.
    ad.map_progress(fn, items[:16], on=False)
    ad.map_progress(fn, items[:16], on=True)
    walls: dict[str, list] = {"off": [], "on": []}
    correct = True
    for mode in ("off", "on", "off", "on"):
        t = time.perf_counter()
        res = ad.map_progress(fn, items, on=mode == "on")
        walls[mode].append(time.perf_counter() - t)
        correct = correct and results_match(res, expected)
    off, on = statistics.mean(walls["off"]), statistics.mean(walls["on"])
    return {
        "items": len(items),
        "wall_s": on,
        "wall_off_s": off,
        "walls": walls,
        "ideal_s": ideal,
        "efficiency": ideal / on,
        "efficiency_off": ideal / off,
        "on_over_off": on / off,
        "correct": correct,
    }


# =====================================================================================
# Parent side: orchestration
# =====================================================================================
def marker_processes(marker: str) -> list:
    """Live processes that inherited this child's marker (ours, by construction)."""
    import psutil

    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get(MARKER_ENV) == marker:
                found.append(p)
        except (psutil.Error, OSError):
            pass
    return found


def end_leftovers(marker: str, grace: float = 5.0) -> list[int]:
    """Wait ``grace`` seconds for the child's processes to exit, then end each by pid."""
    import psutil

    deadline = time.monotonic() + grace
    left = marker_processes(marker)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = marker_processes(marker)
    pids = [p.pid for p in left]
    for p in left:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(left, timeout=3)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    return pids


def netns_prefix(mode: str) -> list[str]:
    """A command prefix that runs the child in a fresh network namespace with only loopback."""
    if mode == "off":
        return []
    ok = shutil.which("unshare") and shutil.which("ip") and os.geteuid() == 0
    if ok:
        probe = subprocess.run(["unshare", "--net", "--", "sh", "-c", "ip link set lo up"], capture_output=True)
        ok = probe.returncode == 0
    if not ok:
        if mode == "on":
            raise SystemExit("--netns on needs root, unshare and ip; use --netns off.")
        return []
    return ["unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"]


def run_child(system: str, cfg: dict, python: str, prefix: list[str], scratch: str, timeout: float) -> dict:
    marker = uuid.uuid4().hex
    out_path = os.path.join(scratch, f"{system}-rep{cfg['rep']}.json")
    cfg_path = out_path[:-5] + ".cfg.json"
    log_path = out_path[:-5] + ".log"
    write_json(cfg_path, cfg)
    env = dict(os.environ)
    env[MARKER_ENV] = marker
    env["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, ROOT, env.get("PYTHONPATH", "")) if p)
    # Keep tool state private to this run: cluster registry, ipyparallel profiles.
    env["JUPYTER_RUNTIME_DIR"] = os.path.join(scratch, "runtime")
    env["IPYTHONDIR"] = os.path.join(scratch, "ipython")
    env["PYTHONWARNINGS"] = "ignore"
    cmd = prefix + [
        python,
        os.path.abspath(__file__),
        "--child",
        system,
        "--child-config",
        cfg_path,
        "--child-out",
        out_path,
    ]
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=scratch)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    try:
        with open(out_path) as f:
            rec = json.load(f)
    except (OSError, ValueError):
        rec = {"system": system, "rep": cfg["rep"], "ok": False, "workloads": {}}
        rec["error"] = f"child exited with {proc.returncode} without results (see {log_path})"
    if proc.returncode not in (0, None) and "error" not in rec:
        rec["error"] = f"child exited with {proc.returncode} (see {log_path})"
    rec["child_wall_s"] = time.perf_counter() - t0
    rec["leaked_pids"] = end_leftovers(marker)
    rec["log"] = log_path
    return rec


def python_for(system: str, args) -> str | None:
    if system in PEER_VENV_SYSTEMS:
        py = args.peer_python
        if not py or not os.path.exists(py):
            return None
        probe = subprocess.run([py, "-c", f"import {system}, psutil"], capture_output=True)
        return py if probe.returncode == 0 else None
    return sys.executable


def parent_main(args) -> int:
    systems = [s for s in args.systems.split(",") if s]
    workloads = [w for w in args.workloads.split(",") if w]
    for w in workloads:
        if w not in ALL_WORKLOADS:
            raise SystemExit(f"unknown workload {w!r}; choose from {', '.join(ALL_WORKLOADS)}.")
    pythons, unavailable = {}, {}
    for s in systems:
        if s not in ALL_SYSTEMS:
            raise SystemExit(f"unknown system {s!r}; choose from {', '.join(ALL_SYSTEMS)}.")
        py = python_for(s, args)
        if py is None:
            unavailable[s] = (
                f"not installed in {args.peer_python} (build it with "
                "`bash ../shared/anchors-bench/setup_env.sh /tmp/anchors-venv`, or pass --peer-python)"
            )
        else:
            pythons[s] = py
    systems = [s for s in systems if s in pythons]
    for s, why in unavailable.items():
        print(f"skipping {s}: {why}", file=sys.stderr)
    sys.path.insert(0, HERE)
    spin_loops = wl.calibrate_spin(0.01)
    scratch = args.scratch or tempfile.mkdtemp(prefix="jc-bench-peers-")
    os.makedirs(scratch, exist_ok=True)
    prefix = netns_prefix(args.netns)
    started = time.time()
    load_before = os.getloadavg()
    print(
        f"{len(systems)} systems × {args.reps} repetitions, workloads {','.join(workloads)}, scale {args.scale}; "
        f"logs in {scratch}; netns {'on' if prefix else 'off'}; load average {load_before[0]:.2f}",
        file=sys.stderr,
    )
    records = []
    for rep in range(args.reps):
        order = systems[rep % len(systems) :] + systems[: rep % len(systems)]
        for s in order:
            cfg = {
                "rep": rep,
                "workers": args.workers,
                "scale": args.scale,
                "workloads": workloads,
                "spin_loops": spin_loops,
                "big_mb": args.big_mb,
                "stage_timeout": args.stage_timeout,
                "max_projected": args.max_projected,
                "scratch": scratch,
            }
            rec = run_child(s, cfg, pythons[s], prefix, scratch, args.child_timeout)
            rec["load_avg"] = os.getloadavg()
            records.append(rec)
            status = "ok" if rec.get("ok") else f"FAILED: {rec.get('error')}"
            print(f"  rep {rep + 1}/{args.reps} {s:12s} {rec['child_wall_s']:6.1f} s  {status}", file=sys.stderr)
    summary = summarise(records, systems, workloads)
    load_after = os.getloadavg()
    meta = {
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime(started)),
        "duration_s": round(time.time() - started, 1),
        "machine": {
            "cpus": os.cpu_count(),
            "memory_gib": _mem_gib(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "load_avg_start": load_before,
        "load_avg_end": load_after,
        "load_avg_during": median([r["load_avg"][0] for r in records]),
        "workers": args.workers,
        "reps": args.reps,
        "scale": args.scale,
        "spin_loops": spin_loops,
        "big_mb": args.big_mb,
        "netns": bool(prefix),
        "unavailable": unavailable,
        "describe": {r["system"]: r.get("describe") for r in records},
        "versions": {k: v for r in records for k, v in (r.get("versions") or {}).items()},
    }
    text = tables(summary, systems, workloads)
    goal = targets(summary)
    header = (
        f"{meta['date_utc']} UTC, {meta['machine']['cpus']} CPUs, {meta['machine']['memory_gib']:.0f} GiB, "
        f"{args.workers} workers × 1 thread, medians of {args.reps} repetitions, scale {args.scale}, "
        f"load average {load_before[0]:.2f} → {load_after[0]:.2f} (median during {meta['load_avg_during']:.2f})"
    )
    report = header + "\n\n" + text + ("\n\nTargets (jupyter_cluster front ends):\n\n" + goal if goal else "")
    if unavailable:
        report += "\n\nNot run: " + "; ".join(f"`{s}` {why}" for s, why in unavailable.items())
    print(report)
    if args.out:
        write_json(args.out, {"meta": meta, "summary": summary, "records": records})
    if args.md:
        with open(args.md, "w") as f:
            f.write(report + "\n")
    return 0 if all(r.get("ok") for r in records) else 1


def _mem_gib() -> float:
    try:
        import psutil

        return psutil.virtual_memory().total / 2**30
    except ImportError:
        return 0.0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--systems", default=",".join(ALL_SYSTEMS), help="comma-separated (default: all available)")
    ap.add_argument("--workloads", default=",".join(ALL_WORKLOADS))
    ap.add_argument("--reps", type=int, default=5, help="repetitions (fresh child per system and repetition)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every item count")
    ap.add_argument("--big-mb", type=float, default=100.0, help="size of the captured array, MB")
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 repetition, scale 0.1, 20 MB array")
    ap.add_argument("--out", help="write raw + summarised results as JSON")
    ap.add_argument("--md", help="write the tables as Markdown")
    ap.add_argument("--peer-python", default=DEFAULT_PEER_PYTHON, help="interpreter that has fiber / ray")
    ap.add_argument(
        "--netns",
        choices=["auto", "on", "off"],
        default="auto",
        help="run children in a private loopback-only network namespace (root + unshare)",
    )
    ap.add_argument("--max-projected", type=float, default=60.0, help="skip noop100k for systems slower than this")
    ap.add_argument("--stage-timeout", type=float, default=120.0)
    ap.add_argument("--child-timeout", type=float, default=900.0)
    ap.add_argument("--scratch", help="directory for child logs and results")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--child-config", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        with open(args.child_config) as f:
            child_main(args.child, json.load(f), args.child_out)
        return 0
    if args.quick:
        if args.reps == ap.get_default("reps"):
            args.reps = 1
        if args.scale == ap.get_default("scale"):
            args.scale = 0.1
        if args.big_mb == ap.get_default("big_mb"):
            args.big_mb = 20.0
    return parent_main(args)


if __name__ == "__main__":
    sys.exit(main())
