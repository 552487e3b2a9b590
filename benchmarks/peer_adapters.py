"""bench_peers' systems: one adapter per system (start it, map a workload, stop it), run in a child."""

from __future__ import annotations

import functools
import threading
import time

import workloads as wl  # benchmarks/ is on sys.path (bench_peers puts it there)

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

        from jupyter_cluster.tracking import progress

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
