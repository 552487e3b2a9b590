"""Simulate 32…1,024 workers on a small machine: where does the map engine's overhead take over?

Method
------
Like the evolution-strategies benchmark of Fiber, each *iteration* evaluates a
population (``--per-worker`` rollouts per worker, default 2) and waits for all
of them; 50 iterations per configuration (``--iterations``).  A rollout is a
sleep of 25–75 ms (seeded, mean ``--rollout-ms`` = 50 ms), standing for an
environment episode; a sleep frees the CPU, so hundreds of simulated workers
fit on two cores and everything that *does* use the CPU is the machinery
under test.

The cluster is a real Dask cluster over TCP on loopback: the scheduler runs in
its own process (as in a deployment), the client (the "notebook") in this
process, and the N single-thread workers are real ``distributed.Worker``
objects packed ``--per-host`` (default 64) to a process, sharing that
process's event loop.  Packing is what makes 1,024 workers fit on a laptop;
its cost is that a worker host's event loop may itself become busy, which a
real cluster would not have, so the CPU share of every role (scheduler,
client, worker hosts) is reported next to the times, and a limit is blamed on
our engine only when the scheduler or client is the saturated role.  What a
real worker process runs once (the statistical profiler, the system monitor,
the event loop's 20 ms tick) runs once per host process here, not once per
packed worker (``HOST_CONFIG``, :func:`host_main`).

``--py-spy DIR`` samples the first worker host, the scheduler and the client
with py-spy during each measured loop (collapsed stacks, GIL-holding samples
only); its figures are not comparable with a run without it.  ``--timeline``
records where each ``jc`` iteration's time went (:func:`_timeline`).

Per configuration (engine × N): time per iteration (median), the ideal (the
population's total sleep ÷ N, or the longest rollout if larger), efficiency =
ideal ÷ time, items per second, Dask tasks per second (the scheduler's
dispatch rate: one task per item for plain Dask, one per chunk for
jupyter_cluster's task path; for its direct path the column counts batches
sent straight to the leases, not scheduler tasks) and the CPU used per role.
Engines: ``jc`` (``jupyter_cluster.map`` with its defaults: leases and direct
batches, through relays from 64 workers on), ``jc-norelay`` (the same, every
batch sent straight from the client), ``jc-tasks`` (the same on the task path, ``engine.path=tasks``) and
``dask`` (``client.map``, one task per item).

Run::

    python benchmarks/scale_sim.py                        # 32…1,024 workers, 50 iterations
    python benchmarks/scale_sim.py --quick                # 32 and 128 workers, 5 iterations
    python benchmarks/scale_sim.py --workers 64,256 --iterations 20 --engines jc
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import workloads as wl  # noqa: E402


# =====================================================================================
# Helper processes: the scheduler, and hosts of many workers
# =====================================================================================
async def _until_stdin_closes() -> None:
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)


async def scheduler_main(addr_file: str) -> None:
    from distributed import Scheduler

    async with Scheduler(host="127.0.0.1", port=0, dashboard=False) as s:
        with open(addr_file + ".tmp", "w") as f:  # noqa: ASYNC230 (once, before any work)
            f.write(s.address)
        os.replace(addr_file + ".tmp", addr_file)
        await _until_stdin_closes()


# A real worker process runs one statistical profiler and one system monitor;
# packed workers would run one *each* in the same process (64 threads sampling
# every thread's stack every 10 ms), which measures the packing, not Dask.
HOST_CONFIG = {
    "distributed.worker.profile.enabled": False,
    "distributed.admin.system-monitor.interval": "10s",
    "distributed.admin.system-monitor.gil.enabled": False,
}


async def host_main(address: str, count: int, name: str) -> None:
    import dask
    from distributed import Worker

    # Each worker is a Server that ticks its event loop every 20 ms to spot a blocked loop; 64 workers on one
    # loop would tick 3,200 times a second (measured: 0.6 of the 2 cores for 256 idle workers, 0.16 without).
    # One tick per 20 ms per host process is what one real worker process pays.
    tick = dask.utils.parse_timedelta(dask.config.get("distributed.admin.tick.interval"), default="ms")
    dask.config.set({**HOST_CONFIG, "distributed.admin.tick.interval": f"{tick * count * 1000:g}ms"})

    workers = [
        Worker(address, nthreads=1, host="127.0.0.1", name=f"{name}-{i}", memory_limit=0, dashboard=False)
        for i in range(count)
    ]
    # Start in small groups: hundreds of simultaneous registrations only measure
    # the start-up storm, which is not what this benchmark is about.
    for i in range(0, count, 32):
        await asyncio.gather(*workers[i : i + 32])
    await _until_stdin_closes()
    try:
        await asyncio.wait_for(asyncio.gather(*(w.close() for w in workers), return_exceptions=True), 20)
    finally:
        os._exit(0)  # leftover worker threads must not keep the host alive


# =====================================================================================
# The simulated cluster
# =====================================================================================
class SimCluster:
    """A scheduler process plus ceil(N / per_host) worker-host processes, all on loopback."""

    def __init__(self, n_workers: int, per_host: int, scratch: str):
        self.n = n_workers
        self.per_host = per_host
        self.scratch = scratch
        self.procs: list[subprocess.Popen] = []

    def _spawn(self, *args: str) -> subprocess.Popen:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, ROOT, env.get("PYTHONPATH", "")) if p)
        env["PYTHONWARNINGS"] = "ignore"
        log = open(os.path.join(self.scratch, f"proc-{len(self.procs)}.log"), "w")
        p = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), *args],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        log.close()
        self.procs.append(p)
        return p

    def start(self, timeout: float = 600) -> float:
        t0 = time.perf_counter()
        addr_file = os.path.join(self.scratch, f"scheduler-{self.n}.addr")
        self.scheduler = self._spawn("--role", "scheduler", "--addr-file", addr_file)
        deadline = time.monotonic() + 60
        while not os.path.exists(addr_file):
            if self.scheduler.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the scheduler process did not start; see its log in " + self.scratch)
            time.sleep(0.05)
        with open(addr_file) as f:
            self.address = f.read().strip()
        left, h = self.n, 0
        self.hosts = []
        while left > 0:
            k = min(left, self.per_host)
            self.hosts.append(
                self._spawn("--role", "host", "--address", self.address, "--count", str(k), "--name", f"h{h}")
            )
            left -= k
            h += 1
        from distributed import Client

        self.client = Client(self.address, timeout=60)
        self.client.wait_for_workers(self.n, timeout=timeout)
        return time.perf_counter() - t0

    def close(self) -> None:
        try:
            self.client.close()
        except Exception:
            pass
        for p in reversed(self.procs):  # hosts first, the scheduler last
            try:
                p.stdin.close()
            except Exception:
                pass
        for p in reversed(self.procs):
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


class CpuMeter:
    """CPU seconds used by each role between start() and stop()."""

    def __init__(self, cluster: SimCluster):
        import psutil

        self.me = psutil.Process()
        self.sched = psutil.Process(cluster.scheduler.pid)
        self.hosts = [psutil.Process(p.pid) for p in cluster.hosts]

    @staticmethod
    def _cpu(p) -> float:
        try:
            t = p.cpu_times()
            return t.user + t.system
        except Exception:
            return 0.0

    def read(self) -> dict:
        return {
            "client": self._cpu(self.me),
            "scheduler": self._cpu(self.sched),
            "hosts": sum(self._cpu(p) for p in self.hosts),
        }

    def start(self) -> None:
        self.t0 = time.perf_counter()
        self.c0 = self.read()

    def stop(self) -> dict:
        wall = time.perf_counter() - self.t0
        c1 = self.read()
        # Share of one core used by each role during the run (1.0 = one core busy).
        return {k: round((c1[k] - self.c0[k]) / wall, 3) for k in c1}


# =====================================================================================
# Engines and the ES-like loop
# =====================================================================================
def population(n_workers: int, per_worker: int, rollout_s: float, rng: random.Random) -> list[float]:
    return [rollout_s * rng.uniform(0.5, 1.5) for _ in range(n_workers * per_worker)]


def run_engine(engine: str, cluster: SimCluster, args) -> dict:
    from distributed import Client  # noqa: F401  (imported for its side effects on the loop)

    client = cluster.client
    rng = random.Random(1234)
    n = cluster.n
    timeline: list[dict] = []

    if engine in ("jc", "jc-tasks", "jc-norelay"):
        import dask

        from jupyter_cluster import mapping

        # jc-tasks: the same map on the task path (one Dask task per chunk, the engine before leases).
        # jc-norelay: the direct path with every batch sent straight from the client (no relays).
        dask.config.set(
            {
                "jupyter-cluster.engine.path": "tasks" if engine == "jc-tasks" else "auto",
                "jupyter-cluster.engine.relay-min-workers": 0 if engine == "jc-norelay" else None,
            }
        )

        def evaluate(pop):
            # progress=False: a script has no widget, and a text bar would flood the log.
            t_call = time.time()
            out = mapping.map(wl.sleep_item, pop, client=client, progress=False)
            job = mapping.last_job()
            if args.timeline:
                timeline.append(_timeline(job, t_call))
            return out, job.chunks_submitted
    elif engine == "dask":

        def evaluate(pop):
            futures = client.map(wl.sleep_item, pop, pure=False)
            return client.gather(futures), len(futures)
    else:
        raise SystemExit(f"unknown engine {engine!r}")

    evaluate(population(n, 1, 0.001, rng))  # warm-up: function shipped, imports done
    timeline.clear()
    meter = CpuMeter(cluster)
    times: list[float] = []
    ideals: list[float] = []
    tasks = items = 0
    spies = _start_spies(engine, cluster, args.py_spy, args.py_spy_rate) if args.py_spy else []
    meter.start()
    t_all = time.perf_counter()
    for _ in range(args.iterations):
        if times and time.perf_counter() - t_all > args.max_seconds:
            break  # enough to know the rate; the rest would only cost time
        pop = population(n, args.per_worker, args.rollout_ms / 1000, rng)
        t0 = time.perf_counter()
        out, k = evaluate(pop)
        times.append(time.perf_counter() - t0)
        if out != pop:
            raise RuntimeError(f"{engine}: wrong results")
        actual = [d + args.overshoot for d in pop]
        ideals.append(max(sum(actual) / n, max(actual)))
        tasks += k
        items += len(pop)
    wall = time.perf_counter() - t_all
    cpu = meter.stop()
    _stop_spies(spies)
    t_med, ideal_med = statistics.median(times), statistics.median(ideals)
    return {
        "engine": engine,
        "workers": n,
        "iterations": len(times),
        "population": n * args.per_worker,
        "iteration_s": t_med,
        "ideal_s": ideal_med,
        "efficiency": statistics.median(i / t for i, t in zip(ideals, times)),
        "overhead_ms": (t_med - ideal_med) * 1000,
        "items_per_s": items / wall,
        "tasks_per_s": tasks / wall,
        "tasks_per_iteration": tasks / len(times),
        "cpu_cores": cpu,
        **(
            {"timeline_ms": {k: round(1000 * statistics.median(t[k] for t in timeline), 1) for k in timeline[0]}}
            if timeline
            else {}
        ),
    }


def _timeline(job, t_call: float) -> dict:
    """Where one ``jc`` iteration's time went, in seconds from the map call (``--timeline``).

    From the map's chunk log (each batch's start on its worker and its busy
    time; one machine, so one clock): when the first and the last batch
    started (the dispatch), the busiest worker's summed item time (the bound
    a static split of the population gives), when the last item ended, and
    the map's return.
    """
    log = job.chunk_log
    busy: dict = {}
    for _start, _n, worker, _t0, secs in log:
        busy[worker] = busy.get(worker, 0.0) + secs
    return {
        "first_start": min(x[3] for x in log) - t_call,
        "last_start": max(x[3] for x in log) - t_call,
        "busiest_worker": max(busy.values()),
        "last_end": max(x[3] + x[4] for x in log) - t_call,
        "returned": (job.ended or time.time()) - t_call,
    }


def _start_spies(engine: str, cluster: SimCluster, folder: str, rate: int = 100) -> list:
    """Sample the first worker host, the scheduler and this process with py-spy during the measured loop.

    Collapsed stacks (py-spy's ``raw`` format, one line per stack with its
    sample count) land in ``folder`` as ``<engine>-<N>-<role>.txt``; idle
    threads are left out, so the samples show where each role's CPU goes.
    ``rate`` is py-spy's samples per second.
    """
    import shutil

    exe = shutil.which("py-spy") or os.environ.get("PY_SPY")
    if not exe:
        raise SystemExit("--py-spy needs the py-spy program on PATH (pip install py-spy) or in $PY_SPY.")
    os.makedirs(folder, exist_ok=True)
    roles = {"host0": cluster.hosts[0].pid, "scheduler": cluster.scheduler.pid, "client": os.getpid()}
    spies = []
    for role, pid in roles.items():
        out = os.path.join(folder, f"{engine}-{cluster.n}-{role}.txt")
        cmd = [exe, "record", "--pid", str(pid), "--format", "raw", "--gil", "--nonblocking", "--output", out]
        cmd += ["--rate", str(rate)]
        spies.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    time.sleep(1.0)  # py-spy attaches in a fraction of a second; the loop must not start before it samples
    return spies


def _stop_spies(spies: list) -> None:
    import signal

    for p in spies:
        p.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
    for p in spies:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()


def bottleneck(row: dict) -> str:
    """Which role limits the run: a saturated one, else the one using the most CPU."""
    cpu = row["cpu_cores"]
    if row["efficiency"] >= 0.9:
        return "the work itself (≥ 90 % efficient)"
    role = max(cpu, key=lambda k: cpu[k] / (1 if k != "hosts" else max(row.get("hosts", 1), 1)))
    if role != "hosts" and cpu[role] >= 0.8:
        return f"{role} CPU (saturated: {cpu[role]:.0%} of a core)"
    if role == "hosts":
        return f"worker hosts ({cpu['hosts']:.2f} cores over {row.get('hosts', '?')} processes: simulation artefact)"
    total = sum(cpu.values())
    return f"{role} ({cpu[role]:.0%} of a core, of {total:.2f} cores used; the rest of the machine was busy)"


def table(rows: list[dict]) -> str:
    lines = [
        "| engine | workers | population | s / iteration | ideal s | efficiency | items/s | tasks/s | tasks / iteration | CPU cores: scheduler / client / worker hosts | limit |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        c = r["cpu_cores"]
        lines.append(
            f"| {r['engine']} | {r['workers']:,} | {r['population']:,} | {r['iteration_s']:.3f} | {r['ideal_s']:.3f} | "
            f"{r['efficiency']:.0%} | {r['items_per_s']:,.0f} | {r['tasks_per_s']:,.0f} | {r['tasks_per_iteration']:,.0f} | "
            f"{c['scheduler']:.2f} / {c['client']:.2f} / {c['hosts']:.2f} | {bottleneck(r)} |"
        )
    return "\n".join(lines)


def overshoot() -> float:
    t0 = time.perf_counter()
    for _ in range(20):
        time.sleep(0.02)
    return max((time.perf_counter() - t0) / 20 - 0.02, 0.0)


def _write(path: str, args, loads: list, rows: list) -> None:
    skip = ("role", "addr_file", "address", "count", "name")
    with open(path + ".tmp", "w") as f:
        json.dump(
            {"args": {k: v for k, v in vars(args).items() if k not in skip}, "load_avg": loads, "rows": rows},
            f,
            indent=1,
        )
    os.replace(path + ".tmp", path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--workers", default="32,64,128,256,512,1024", help="simulated worker counts")
    ap.add_argument("--engines", default="jc,dask")
    ap.add_argument("--iterations", type=int, default=50)
    ap.add_argument("--per-worker", type=int, default=2, help="rollouts per worker per iteration")
    ap.add_argument("--rollout-ms", type=float, default=50.0, help="mean rollout (sleep) duration")
    ap.add_argument("--per-host", type=int, default=64, help="workers per worker-host process")
    ap.add_argument(
        "--max-seconds",
        type=float,
        default=90.0,
        help="stop a configuration's iterations after this long (reported: iterations actually run)",
    )
    ap.add_argument("--quick", action="store_true", help="32 and 128 workers, 5 iterations")
    ap.add_argument(
        "--py-spy",
        metavar="DIR",
        help="profile the first worker host, the scheduler and the client with py-spy during each measured loop "
        "(collapsed stacks in DIR; figures taken with it on are not comparable)",
    )
    ap.add_argument("--py-spy-rate", type=int, default=100, help="py-spy's samples per second (with --py-spy)")
    ap.add_argument(
        "--timeline",
        action="store_true",
        help="for jc engines, record when each iteration's first and last batch started, the busiest worker's "
        "item time and when the last item ended (medians in the JSON row and after the table)",
    )
    ap.add_argument("--out", help="write the results as JSON")
    ap.add_argument("--md", help="write the table as Markdown")
    ap.add_argument("--role", help=argparse.SUPPRESS)
    ap.add_argument("--addr-file", help=argparse.SUPPRESS)
    ap.add_argument("--address", help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--name", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.role == "scheduler":
        asyncio.run(scheduler_main(args.addr_file))
        return 0
    if args.role == "host":
        asyncio.run(host_main(args.address, args.count, args.name))
        return 0
    if args.quick:
        if args.workers == ap.get_default("workers"):
            args.workers = "32,128"
        if args.iterations == ap.get_default("iterations"):
            args.iterations = 5
    args.overshoot = overshoot()
    counts = [int(x) for x in args.workers.split(",") if x]
    engines = [e for e in args.engines.split(",") if e]
    scratch = tempfile.mkdtemp(prefix="jc-scale-sim-")
    started = time.time()
    load0 = os.getloadavg()
    print(
        f"scale simulation: workers {counts}, engines {engines}, {args.iterations} iterations, "
        f"{args.per_worker} rollouts/worker of ~{args.rollout_ms:.0f} ms; logs in {scratch}; load {load0[0]:.2f}",
        file=sys.stderr,
    )
    rows = []
    for n in counts:
        cluster = SimCluster(n, args.per_host, scratch)
        try:
            up = cluster.start()
            print(f"  {n} workers up in {up:.1f} s", file=sys.stderr)
            for engine in engines:
                row = run_engine(engine, cluster, args)
                row["cluster_start_s"] = up
                row["hosts"] = len(cluster.hosts)
                row["load_avg"] = os.getloadavg()[0]
                rows.append(row)
                if args.out:  # written after every configuration, so an interrupted run keeps its rows
                    _write(args.out, args, [load0], rows)
                print(
                    f"  {engine:5s} {n:5d} workers: {row['iteration_s']:.3f} s/iteration (ideal {row['ideal_s']:.3f}), "
                    f"{row['tasks_per_s']:,.0f} tasks/s, efficiency {row['efficiency']:.0%}",
                    file=sys.stderr,
                )
        finally:
            cluster.close()
    load1 = os.getloadavg()
    header = (
        f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(started))} UTC, {os.cpu_count()} CPUs, "
        f"{args.iterations} iterations, {args.per_worker} rollouts per worker of {args.rollout_ms:.0f} ms ± 50 %, "
        f"{args.per_host} workers per host process, load average {load0[0]:.2f} → {load1[0]:.2f}"
    )
    text = header + "\n\n" + table(rows)
    for r in rows:
        if "timeline_ms" in r:
            parts = ", ".join(f"{k.replace('_', ' ')} {v:g}" for k, v in r["timeline_ms"].items())
            text += f"\n\n{r['engine']} {r['workers']:,} workers, median ms from the map call: {parts}"
    print(text)
    if args.out:
        _write(args.out, args, [load0, load1], rows)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
