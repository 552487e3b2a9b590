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
result back.  Each workload gets an untimed warm-up map (2 items per worker).
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
import functools
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

ALL_SYSTEMS = [
    "mp",
    "mp+50",
    "dask",
    "dask+50",
    "ipp",
    "fiber",
    "ray",
    "jc-parallel",
    "jc-pool",
    "jc-map",
    "jc-map-tasks",
]
JC_SYSTEMS = ["jc-parallel", "jc-pool", "jc-map", "jc-map-tasks"]
PEER_VENV_SYSTEMS = {"fiber", "ray"}  # not in the project's venv; run with --peer-python
ALL_WORKLOADS = ["noop", "noop100k", "sleep1ms", "sleep10ms", "cpu10ms", "tail", "bigarray", "progress"]
# Which systems run which special workloads (the others run everywhere).
BIGARRAY_SYSTEMS = {"dask", "dask+50", *JC_SYSTEMS}
PROGRESS_SYSTEMS = {"jc-map"}
MARKER_ENV = "JC_BENCH_MARKER"
DEFAULT_PEER_PYTHON = "/tmp/anchors-venv/bin/python"


# =====================================================================================
# Child side: adapters
# =====================================================================================
class Adapter:
    """start(), map(fn, items) -> list in input order, stop(); optional big-array map."""

    describe = ""

    def __init__(self, workers: int):
        self.workers = workers
        self.last_job_stats: dict | None = None

    def start(self) -> None:
        raise NotImplementedError

    def map(self, fn, items: list) -> list:
        raise NotImplementedError

    def map_big(self, payload, items: list) -> list:
        return self.map(wl.make_lookup(payload), items)

    def stop(self) -> None:
        raise NotImplementedError

    def versions(self) -> dict:
        return {}


class MpAdapter(Adapter):
    def __init__(self, workers: int, chunksize: int):
        super().__init__(workers)
        self.chunksize = chunksize
        self.describe = f"multiprocessing.Pool({workers}).map(fn, items, chunksize={chunksize}) (fork)"

    def start(self):
        import multiprocessing

        self.pool = multiprocessing.get_context("fork").Pool(self.workers)

    def map(self, fn, items):
        return self.pool.map(fn, items, chunksize=self.chunksize)

    def stop(self):
        self.pool.close()
        self.pool.join()


class DaskAdapter(Adapter):
    def __init__(self, workers: int, batch: int = 1):
        super().__init__(workers)
        self.batch = batch
        how = "client.map(fn, items, pure=False)" if batch == 1 else f"client.map over {batch}-item batches"
        self.describe = f"LocalCluster({workers} processes × 1 thread) + {how}"

    def start(self):
        from distributed import Client, LocalCluster

        self.cluster = LocalCluster(
            n_workers=self.workers,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
        )
        self.client = Client(self.cluster)

    def _map(self, fn, items, **kwargs):
        if self.batch == 1:
            futures = self.client.map(fn, items, pure=False, **kwargs)
            return self.client.gather(futures)
        batches = [items[i : i + self.batch] for i in range(0, len(items), self.batch)]
        futures = self.client.map(functools.partial(wl.run_batch, fn), batches, pure=False, **kwargs)
        return [y for part in self.client.gather(futures) for y in part]

    def map(self, fn, items):
        return self._map(fn, items)

    def map_big(self, payload, items):
        # Dask's idiom for a large shared value: scatter it to every worker once.
        future = self.client.scatter(payload, broadcast=True, hash=False)
        try:
            return self._map(wl.lookup_in, items, payload=future)
        finally:
            future.release()

    def stop(self):
        self.client.close()
        self.cluster.close()

    def versions(self):
        import dask
        import distributed

        return {"dask": dask.__version__, "distributed": distributed.__version__}


class IppAdapter(Adapter):
    describe = "ipyparallel.Cluster(n=W) + load_balanced_view().map_sync(fn, items)"

    def start(self):
        import ipyparallel as ipp

        self.cluster = ipp.Cluster(n=self.workers, controller_ip="127.0.0.1", log_level=40)
        self.rc = self.cluster.start_and_connect_sync()
        self.rc.wait_for_engines(self.workers, timeout=120)
        self.rc[:].use_cloudpickle()
        self.view = self.rc.load_balanced_view()

    def map(self, fn, items):
        return list(self.view.map_sync(fn, items))

    def stop(self):
        self.rc.close()
        self.cluster.stop_cluster_sync()

    def versions(self):
        import ipyparallel

        return {"ipyparallel": ipyparallel.__version__}


class FiberAdapter(Adapter):
    describe = "fiber.Pool(W).map(fn, items, chunksize=1) (local backend)"

    def start(self):
        import fiber

        self.pool = fiber.Pool(self.workers)

    def map(self, fn, items):
        return self.pool.map(fn, items, chunksize=1)

    def stop(self):
        self.pool.close()
        self.pool.join()

    def versions(self):
        import fiber

        return {"fiber": fiber.__version__}


class RayAdapter(Adapter):
    describe = "ray.init(num_cpus=W) + ray.util.multiprocessing.Pool(W).map(fn, items, chunksize=1)"

    def start(self):
        import ray
        from ray.util.multiprocessing import Pool

        ray.init(num_cpus=self.workers, include_dashboard=False, log_to_driver=False, configure_logging=False)
        self.ray = ray
        self.pool = Pool(self.workers)

    def map(self, fn, items):
        return self.pool.map(fn, items, chunksize=1)

    def stop(self):
        self.pool.close()
        self.ray.shutdown()

    def versions(self):
        import ray

        return {"ray": ray.__version__}


class JcAdapter(Adapter):
    """Shared start/stop of the jupyter_cluster front ends (Python API)."""

    def start(self):
        import jupyter_cluster as jc

        self.jc = jc
        self.handle = jc.start(workers=self.workers, threads=1)

    def _job_stats(self):
        from jupyter_cluster import mapping

        job = mapping.last_job()
        if job is None:
            return None
        return {
            "chunks": getattr(job, "chunks_submitted", None),
            "peak_in_flight": getattr(job, "peak_in_flight", None),
            "items": job.total,
        }

    def map(self, fn, items):
        out = self._map(fn, items)
        self.last_job_stats = self._job_stats()
        return out

    def stop(self):
        self.handle.close()

    def versions(self):
        import distributed

        import jupyter_cluster

        return {"jupyter_cluster": jupyter_cluster.__version__, "distributed": distributed.__version__}


class JcMapAdapter(JcAdapter):
    describe = "jupyter_cluster.map(fn, items) (chunksize='auto')"

    def _map(self, fn, items, **options):
        from jupyter_cluster import mapping

        run = getattr(self.jc, "map", None) or mapping.map
        return run(fn, items, **options)

    def map_progress(self, fn, items, on: bool):
        """The map with the progress widget and job telemetry forced on, or both off."""
        import dask

        from jupyter_cluster.telemetry import progress

        if on:
            progress.set_renderer("widget")
            cfg = {"jupyter-cluster.progress.publish": True, "jupyter-cluster.progress.delay": 0}
        else:
            progress.set_renderer("none")
            cfg = {"jupyter-cluster.progress.publish": False}
        try:
            with dask.config.set(cfg):
                return self._map(fn, items, progress=on)
        finally:
            progress.set_renderer(None)


class JcMapTasksAdapter(JcMapAdapter):
    """``jupyter_cluster.map`` forced onto the task path (one Dask task per chunk, the engine before leases)."""

    describe = "jupyter_cluster.map(fn, items), engine.path=tasks (one Dask task per chunk)"

    def start(self):
        import dask

        dask.config.set({"jupyter-cluster.engine.path": "tasks"})
        super().start()


class JcPoolAdapter(JcAdapter):
    describe = "jupyter_cluster.Pool().map(fn, items) (chunksize=None: auto)"

    def start(self):
        super().start()
        self.pool = self.jc.Pool()

    def _map(self, fn, items):
        return self.pool.map(fn, items)

    def stop(self):
        self.pool.close()
        self.pool.join()
        super().stop()


class JcParallelAdapter(JcAdapter):
    """``%%parallel`` typed into a real IPython shell, exactly as a notebook user would."""

    describe = "%cluster start + %%parallel x in items --out result (real IPython shell)"

    def start(self):
        from IPython.testing.globalipapp import start_ipython

        self.shell = start_ipython()
        self._magic("load_ext", "jupyter_cluster")
        if "parallel" not in self.shell.magics_manager.magics["cell"]:
            raise RuntimeError("%%parallel is not registered by jupyter_cluster (the cell magic is not built yet)")
        # %load_ext imports the engine in a background thread while the user
        # writes the next cell; a notebook user's `%cluster start` comes after
        # that, so wait for it (the start-up column still counts the wait).
        t0 = time.perf_counter()
        for t in threading.enumerate():
            if t.name == "jupyter-cluster-import":
                t.join(30)
        self.preload_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        self._magic("cluster", f"start --workers {self.workers} --threads 1")
        self.cluster_start_s = time.perf_counter() - t0

    def _magic(self, name, line):
        return self.shell.run_line_magic(name, line)

    def _cell(self, body: str, items: list, **names) -> list:
        ns = self.shell.user_ns
        ns.update(names)
        ns["_bench_items"] = items
        ns.pop("_bench_out", None)
        result = self.shell.run_cell(f"%%parallel x in _bench_items --out _bench_out\n{body}\n", store_history=False)
        if not result.success:
            err = result.error_in_exec or result.error_before_exec
            raise RuntimeError(f"%%parallel cell failed: {type(err).__name__}: {err}")
        return list(ns["_bench_out"])

    def _map(self, fn, items):
        return self._cell("_bench_fn(x)", items, _bench_fn=fn)

    def map_big(self, payload, items):
        out = self._cell("float(payload.arr[(x * 9973) % len(payload.arr)])", items, payload=payload)
        self.last_job_stats = self._job_stats()
        return out

    def stop(self):
        self._magic("cluster", "stop")


def make_adapter(system: str, workers: int) -> Adapter:
    factories = {
        "mp": lambda: MpAdapter(workers, 1),
        "mp+50": lambda: MpAdapter(workers, 50),
        "dask": lambda: DaskAdapter(workers),
        "dask+50": lambda: DaskAdapter(workers, 50),
        "ipp": lambda: IppAdapter(workers),
        "fiber": lambda: FiberAdapter(workers),
        "ray": lambda: RayAdapter(workers),
        "jc-parallel": lambda: JcParallelAdapter(workers),
        "jc-pool": lambda: JcPoolAdapter(workers),
        "jc-map": lambda: JcMapAdapter(workers),
        "jc-map-tasks": lambda: JcMapTasksAdapter(workers),
    }
    if system not in factories:
        raise SystemExit(f"unknown system {system!r}; choose from {', '.join(ALL_SYSTEMS)}.")
    return factories[system]()


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
        first = ad.map(wl.identity, [0])
        rec["startup_s"] = time.perf_counter() - t0
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


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarise(records: list[dict], systems: list[str], workloads: list[str]) -> dict:
    """Medians per (system, workload) and per-repetition ratios to mp and to ipp."""
    by = {(r["system"], r["rep"]): r for r in records}
    reps = sorted({r["rep"] for r in records})
    out: dict = {}
    for s in systems:
        rs = [by[(s, k)] for k in reps if (s, k) in by]
        row: dict = {
            "startup_s": median([r.get("startup_s") for r in rs]),
            "cluster_start_s": median([r.get("cluster_start_s") for r in rs]),
            "preload_s": median([r.get("preload_s") for r in rs]),
            "stop_s": median([r.get("stop_s") for r in rs]),
            "errors": sorted({r["error"] for r in rs if r.get("error")}),
            "skipped": {k: v for r in rs for k, v in r.get("skipped", {}).items()},
            "leaked_pids": [p for r in rs for p in r.get("leaked_pids", [])],
            "reps_ok": sum(1 for r in rs if r.get("ok")),
            "workloads": {},
        }
        for name in workloads:
            ws = [r["workloads"][name] for r in rs if name in r.get("workloads", {})]
            if not ws:
                continue
            cell = {
                "reps": len(ws),
                "items": ws[0].get("items"),
                "wall_s": median([w["wall_s"] for w in ws]),
                "wall_min_s": min(w["wall_s"] for w in ws),
                "wall_max_s": max(w["wall_s"] for w in ws),
                "ideal_s": median([w.get("ideal_s") for w in ws]),
                "efficiency": median([w.get("efficiency") for w in ws]),
                "us_per_item": median([w.get("us_per_item") for w in ws]),
                "overhead_us_per_item": median([w.get("overhead_us_per_item") for w in ws]),
                "cpu_driver_s": median([w.get("cpu", {}).get("driver_s") for w in ws]),
                "cpu_rest_s": median([w.get("cpu", {}).get("rest_s") for w in ws]),
                "correct": all(w.get("correct", False) for w in ws),
            }
            for key in (
                "transfers_per_worker",
                "mb_transferred",
                "deserialisations",
                "on_over_off",
                "wall_off_s",
                "efficiency_off",
            ):
                if key in ws[0]:
                    cell[key] = median([w.get(key) for w in ws])
            chunks = [w["job"]["chunks"] for w in ws if w.get("job") and w["job"].get("chunks") is not None]
            if chunks:
                cell["chunks"] = median(chunks)
            for base, key, field in (
                ("mp", "ratio_to_mp", "wall_s"),
                ("ipp", "speedup_vs_ipp", "wall_s"),
                ("ipp", "overhead_speedup_vs_ipp", "overhead_us_per_item"),
            ):
                ratios = []
                for k in reps:
                    mine, theirs = by.get((s, k)), by.get((base, k))
                    if not mine or not theirs:
                        continue
                    a = mine.get("workloads", {}).get(name, {}).get(field)
                    b = theirs.get("workloads", {}).get(name, {}).get(field)
                    if a and b:
                        ratios.append(a / b if key == "ratio_to_mp" else b / a)
                cell[key] = median(ratios)
            row["workloads"][name] = cell
        for base, key in (("mp", "startup_ratio_to_mp"),):
            ratios = [
                by[(s, k)]["startup_s"] / by[(base, k)]["startup_s"]
                for k in reps
                if (s, k) in by and (base, k) in by and by[(s, k)].get("startup_s") and by[(base, k)].get("startup_s")
            ]
            row[key] = median(ratios)
        out[s] = row
    return out


# -- formatting ----------------------------------------------------------------------------
def fmt(v, kind="num"):
    if v is None:
        return "—"
    if kind == "pct":
        return f"{100 * v:.0f} %"
    if kind == "x":
        return f"{v:.2f}×" if v < 10 else f"{v:.0f}×"
    if kind == "us":
        return f"{v:,.1f}" if v < 100 else f"{v:,.0f}"
    if kind == "s":
        return f"{v:.3f}" if v < 1 else f"{v:.2f}"
    return f"{v:.3g}"


def tables(summary: dict, systems: list[str], workloads: list[str]) -> str:
    main_cols = [
        ("start-up s", lambda r: fmt(r["startup_s"], "s")),
        ("noop µs/item", lambda r: _w(r, "noop", "us_per_item", "us")),
        ("noop100k µs/item", lambda r: _w(r, "noop100k", "us_per_item", "us")),
        ("sleep1ms eff", lambda r: _w(r, "sleep1ms", "efficiency", "pct")),
        ("sleep10ms eff", lambda r: _w(r, "sleep10ms", "efficiency", "pct")),
        ("cpu10ms eff", lambda r: _w(r, "cpu10ms", "efficiency", "pct")),
        ("tail eff", lambda r: _w(r, "tail", "efficiency", "pct")),
        ("bigarray s", lambda r: _w(r, "bigarray", "wall_s", "s")),
        ("bigarray transfers/worker", lambda r: _w(r, "bigarray", "transfers_per_worker")),
    ]
    keep = {
        "noop": "noop µs/item",
        "noop100k": "noop100k µs/item",
        "sleep1ms": "sleep1ms eff",
        "sleep10ms": "sleep10ms eff",
        "cpu10ms": "cpu10ms eff",
        "tail": "tail eff",
        "bigarray": "bigarray",
    }
    cols = [c for c in main_cols if not any(c[0].startswith(v) and k not in workloads for k, v in keep.items())]
    lines = ["| system | " + " | ".join(c[0] for c in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for s in systems:
        if s in summary:
            lines.append(f"| `{s}` | " + " | ".join(c[1](summary[s]) for c in cols) + " |")
    ratio_wls = [
        w for w in ("noop", "noop100k", "sleep1ms", "sleep10ms", "cpu10ms", "tail", "bigarray") if w in workloads
    ]
    if "mp" in summary:
        lines += _ratio_tables(summary, systems, workloads, ratio_wls)
    else:
        lines += ["", "(no `mp` in this run: no ratios to multiprocessing)"]
    if "ipp" in summary:
        lines += _ipp_table(summary, systems, workloads)
    lines += _notes(summary, systems, workloads)
    return "\n".join(lines)


def _ratio_tables(summary, systems, workloads, ratio_wls):
    lines = [
        "",
        "Wall time ÷ `mp` (multiprocessing.Pool, chunksize=1), median of per-repetition ratios (< 1: faster than mp):",
        "",
    ]
    lines += ["| system | start-up | " + " | ".join(ratio_wls) + " |", "|---" * (len(ratio_wls) + 2) + "|"]
    for s in systems:
        if s in summary:
            r = summary[s]
            cells = [fmt(r.get("startup_ratio_to_mp"), "x")] + [_w(r, w, "ratio_to_mp", "x") for w in ratio_wls]
            lines.append(f"| `{s}` | " + " | ".join(cells) + " |")
    return lines


def _ipp_table(summary, systems, workloads):
    lines = [
        "",
        "Speed-up over ipyparallel: wall (ipp wall ÷ system wall) and overhead per item "
        "((wall − ideal) ÷ items, ipp ÷ system); target for jupyter_cluster ≥ 30× on noop and sleep1ms.",
        "",
    ]
    sp_wls = [w for w in ("noop", "sleep1ms", "sleep10ms", "cpu10ms") if w in workloads]
    head = [f"{w} wall" for w in sp_wls] + [f"{w} overhead" for w in sp_wls if w != "noop"]
    lines += ["| system | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|"]
    for s in systems:
        if s in summary and s != "ipp":
            cells = [_w(summary[s], w, "speedup_vs_ipp", "x") for w in sp_wls]
            cells += [_w(summary[s], w, "overhead_speedup_vs_ipp", "x") for w in sp_wls if w != "noop"]
            lines.append(f"| `{s}` | " + " | ".join(cells) + " |")
    return lines


def _notes(summary, systems, workloads):
    extra = []
    for s in systems:
        r = summary.get(s)
        if not r:
            continue
        if r.get("cluster_start_s") is not None:
            extra.append(
                f"- `{s}`: `%cluster start --workers 2` took {fmt(r['cluster_start_s'], 's')} s (median), after "
                f"`%load_ext jupyter_cluster` had imported the engine in the background "
                f"({fmt(r.get('preload_s'), 's')} s still to wait when the start-up clock began)."
            )
        p = r["workloads"].get("progress")
        if p:
            extra.append(
                f"- `{s}`: progress widget + job telemetry on vs off, {p['items']:,} items: "
                f"{fmt(p['wall_s'], 's')} s vs {fmt(p.get('wall_off_s'), 's')} s (on ÷ off = {p.get('on_over_off', 0):.3f}; "
                f"efficiency {fmt(p.get('efficiency'), 'pct')} vs {fmt(p.get('efficiency_off'), 'pct')})."
            )
        b = r["workloads"].get("bigarray")
        if b:
            extra.append(
                f"- `{s}`: bigarray moved {b.get('mb_transferred', 0):,.0f} MB "
                f"({b.get('deserialisations')} deserialisations in worker processes) for {b['items']:,} items."
            )
        if r["errors"]:
            extra.append(f"- `{s}`: errors: {'; '.join(r['errors'])}")
        for k, v in r["skipped"].items():
            if k in workloads and k not in ("bigarray", "progress"):
                extra.append(f"- `{s}`: {k} skipped: {v}")
        if r["leaked_pids"]:
            extra.append(f"- `{s}`: processes left behind and ended by pid: {r['leaked_pids']}")
        wrong = [w for w, c in r["workloads"].items() if not c["correct"]]
        if wrong:
            extra.append(f"- `{s}`: WRONG RESULTS in {', '.join(wrong)}")
    return ["", "Notes:", ""] + extra if extra else []


def _w(row, name, key, kind="num"):
    return fmt(row["workloads"].get(name, {}).get(key), kind)


def targets(summary: dict) -> str:
    """The issue's targets for the jupyter_cluster front ends, measured vs wanted."""
    checks = [
        ("sleep1ms efficiency ≥ 95 %", "sleep1ms", "efficiency", lambda v: v >= 0.95, "pct"),
        ("cpu10ms efficiency ≥ 95 %", "cpu10ms", "efficiency", lambda v: v >= 0.95, "pct"),
        ("sleep10ms efficiency ≥ 98 %", "sleep10ms", "efficiency", lambda v: v >= 0.98, "pct"),
        ("noop faster than mp chunksize=1 (ratio < 1)", "noop", "ratio_to_mp", lambda v: v < 1, "x"),
        ("noop100k < 10 µs per item", "noop100k", "us_per_item", lambda v: v < 10, "us"),
        ("≥ 30× ipp on noop", "noop", "speedup_vs_ipp", lambda v: v >= 30, "x"),
        ("≥ 30× ipp on sleep1ms (wall)", "sleep1ms", "speedup_vs_ipp", lambda v: v >= 30, "x"),
        ("≥ 30× ipp on sleep1ms (overhead per item)", "sleep1ms", "overhead_speedup_vs_ipp", lambda v: v >= 30, "x"),
        ("bigarray ≈ 1 transfer per worker", "bigarray", "transfers_per_worker", lambda v: v <= 1.5, "num"),
        ("progress on within 5 % of off", "progress", "on_over_off", lambda v: v <= 1.05, "num"),
    ]
    jc = [s for s in JC_SYSTEMS if s in summary]
    if not jc:
        return ""
    lines = ["| target | " + " | ".join(f"`{s}`" for s in jc) + " |", "|---" * (len(jc) + 1) + "|"]
    for label, wname, key, ok, kind in checks:
        cells = []
        for s in jc:
            v = summary[s]["workloads"].get(wname, {}).get(key)
            cells.append("—" if v is None else f"{fmt(v, kind)} {'✓' if ok(v) else '✗'}")
        if any(c != "—" for c in cells):
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    cs = summary.get("jc-parallel", {}).get("cluster_start_s")
    if cs is not None:
        lines.append(f"| `%cluster start` < 2 s | {fmt(cs, 's')} s {'✓' if cs < 2 else '✗'} |" + " |" * (len(jc) - 1))
    return "\n".join(lines)


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
