"""One detached job, driven in the host process through the map engine.

The host reads the job's spec (the function, the items, the map options) from
the store, runs a :class:`~jupyter_cluster.mapping.MapJob` over the items that
have no result yet (all of them at first, the missing ones on ``resume``), and
appends each result to the store as it comes back
(:class:`~jupyter_cluster.state.job_store.ResultWriter`).  The job's metadata
carries its state, counts and the host's pid, so any process can tell a
running job from one whose host died ("lost").
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import cloudpickle
import psutil

from .. import mapping
from ..state import job_store
from ..tracking.record import kept_jobs
from ..tracking.tags import ItemTap

logger = logging.getLogger(__name__)
#: how often the running counts in the metadata are brought up to date (seconds)
META_INTERVAL = 0.5
#: how long an ended map's last run message may take to be published (seconds)
RUN_WAIT = 2.0


def host_identity() -> dict[str, Any]:
    """This process's pid and start time, which tell a live host from a recycled pid."""
    return {"host_pid": os.getpid(), "host_started": round(psutil.Process().create_time(), 2)}


def host_alive(meta: dict[str, Any]) -> bool:
    """Whether the host named in a job's metadata still runs."""
    pid = meta.get("host_pid")
    if not isinstance(pid, int):
        return False
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        return round(process.create_time(), 2) == meta.get("host_started")
    except (psutil.Error, ValueError):
        return False


class JobRun:
    """A detached job being driven by this host, in a thread of its own."""

    def __init__(self, name: str, handle: Any, cluster: str):
        self.name = name
        self.handle = handle
        self.cluster = cluster
        self._cancel = threading.Event()
        #: the map driven (its run message is kept next to the job)
        self._map: Any = None
        self.thread = threading.Thread(target=self._main, name=f"jupyter-cluster-job-{name}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()

    def _main(self) -> None:
        try:
            self._drive()
        except BaseException as exc:  # noqa: BLE001 - the job's metadata must say why it ended
            logger.exception("detached job %s failed", self.name)
            reason = _reason(exc)
            job_store.update_meta(self.name, state="failed", reason=reason, ended=time.time())

    def _drive(self) -> None:
        name = self.name
        spec = cloudpickle.loads(job_store.read_spec(name))
        iterables: list[list] = spec["iterables"]
        total = len(iterables[0]) if iterables else 0
        done = job_store.done_indices(name)
        failed = sum(1 for kind in done.values() if kind == job_store.KIND_ERROR)
        todo = [i for i in range(total) if i not in done]
        meta = job_store.read_meta(name) or {}
        errors_mode = spec["options"].get("errors", "raise")
        if failed and errors_mode == "raise":  # a resumed job that had already failed stays failed
            todo = []
        meta.update(
            host_identity(),
            state="running",
            cluster=self.cluster,
            total=total,
            done=len(done) - failed,
            failed=failed,
            running_since=time.time(),
            reason=None,
            ended=None,
            runs=int(meta.get("runs") or 0) + 1,
        )
        job_store.write_meta(name, meta)
        writer = job_store.ResultWriter(name)
        try:
            state, reason = self._run(spec, iterables, todo, writer, meta, errors_mode)
        finally:
            writer.close()
        meta.update(state=state, reason=reason, ended=time.time())
        job_store.write_meta(name, meta)
        if self._map is not None:  # after the state: on a full disk the state must be written first
            self._keep_run(self._map, ended=True)
        evicted = job_store.evict_over_limit(keep=name)
        if evicted:
            logger.warning("jupyter_cluster: evicted the results of %s to stay under the store limit", evicted)

    def _run(
        self, spec: dict, iterables: list[list], todo: list[int], writer: Any, meta: dict, errors_mode: str
    ) -> tuple[str, str | None]:
        if not todo:
            if meta["failed"] and errors_mode == "raise":
                return "failed", meta.get("reason") or "an item failed"
            return "finished", None
        options = dict(spec["options"])
        options.update(ordered=False, retain=False, errors="collect", client=self.handle, progress=False)
        inputs: list[Any] = [[it[i] for i in todo] for it in iterables]
        tag = spec.get("tag")
        # the run's notebook, cell and kernel are the submitting kernel's (this host has none)
        source = meta.get("origin") if isinstance(meta.get("origin"), dict) else {}
        if tag is not None and len(inputs) == 1:  # a %%parallel sweep: the map is its run's, as in the kernel
            tap = ItemTap(inputs[0], tag)
            job = mapping.imap(spec["fn"], tap, tap=tap, origin=source, **options)
        else:
            job = mapping.imap(spec["fn"], *inputs, origin=source, **options)
        self._map = job
        last_meta = 0.0
        try:
            while True:
                if self._cancel.is_set():
                    job.cancel()
                    return "cancelled", "cancelled on request"
                ended = job.finished
                for k, value in job.drain():
                    index = todo[k]
                    error = k in job.errors
                    if error:
                        tb = job.tracebacks.get(k, ("", None))[0]
                        writer.add(index, (value, tb), error=True)
                        meta["failed"] += 1
                        if errors_mode == "raise":
                            job.cancel()
                            return "failed", f"item {index} failed: {type(value).__name__}: {value}"
                    else:
                        writer.add(index, value)
                        meta["done"] += 1
                if ended:
                    break
                now = time.monotonic()
                if now - last_meta >= META_INTERVAL:
                    last_meta = now
                    job_store.write_meta(self.name, meta)
                    self._keep_run(job)
        except BaseException as exc:
            if not job.finished:
                job.cancel()
            if job_store.disk_full(exc):
                return "failed", _reason(exc)
            raise
        if job.state != "finished":
            return "failed", f"the map ended {job.state}"
        return "finished", None

    def _keep_run(self, job: Any, ended: bool = False) -> None:
        """Write the map's run message (as this host published it) next to the job, for ``jc.runs()`` anywhere."""
        job_id = str(getattr(job, "id", ""))
        deadline = time.monotonic() + (RUN_WAIT if ended else 0.0)
        while True:
            msg = next((m for m in kept_jobs() if m.get("job") == job_id), None)
            if msg is not None and (not ended or msg.get("state") != "running"):
                break
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)  # the observer publishes the ended map's last message from its own thread
        if msg is not None:
            try:
                job_store.write_run(self.name, msg)
            except OSError as exc:  # a full disk fails the job through its results, not through this
                logger.debug("detached job %s: run record not written: %s", self.name, exc)


def _reason(exc: BaseException) -> str:
    if job_store.disk_full(exc):
        return (
            f"the disk is full: the results could not be written to {job_store.store_dir()} "
            f"({getattr(exc, 'strerror', exc)}); "
            "free space there (or set jupyter-cluster.detached.store-dir) and resume() the job"
        )
    return f"{type(exc).__name__}: {exc}"
