"""The batch-queue backend: each worker one batch job that dask-jobqueue writes and submits.

:class:`JobqueueBackend` starts a cluster (options checked first, TLS credentials the jobs
read, the scheduler in the notebook's process), prints a worker's job script for
``--dry-run``, and on SLURM waits for the first worker, raising SLURM's reason at once when
the jobs will not start.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any, ClassVar, cast

from ... import config
from ...errors import ClusterError
from .. import Backend, StartedCluster
from ..cli import ADAPT_MAX, ADAPT_MIN, HOST, MEMORY_LIMIT, PORT, THREADS, TLS, WORKERS, Option
from .credentials import _copy_private, _job_security, shared_directory
from .facts import FACTS_KEY, _Facts, apply_facts
from .options import reachable_host, resolve
from .slurm import _sbatch_why, cancel_jobs, pending_reason, start_watchdog
from .systems import SYSTEMS, BatchSystem

if TYPE_CHECKING:
    from ...state.registry import ClusterRecord

INSTALL_HINT = "pip install 'jupyter-cluster[hpc]'"


_IMPORT_LOCK = threading.Lock()


def _import_dask_jobqueue() -> Any:
    """Import dask-jobqueue without letting it take over Ctrl-C.

    ``dask_jobqueue.runner`` (imported by its SLURM module) calls
    ``signal.signal(SIGINT, lambda *_: sys.exit())`` at import time: in a kernel
    that turns the stop button into a ``SystemExit``, in a script Ctrl-C into an
    exit without a traceback, and off the main thread (a server's executor) the
    import fails outright.  That one call is skipped while the module loads.
    """
    import signal

    with _IMPORT_LOCK:
        if "dask_jobqueue" in sys.modules:
            return sys.modules["dask_jobqueue"]
        install = signal.signal

        def keep_sigint(signum: Any, handler: Any) -> Any:
            if signum == signal.SIGINT:
                return signal.getsignal(signum)
            return install(signum, handler)

        signal.signal = keep_sigint  # type: ignore[assignment]
        try:
            import dask_jobqueue
        finally:
            signal.signal = install
    return dask_jobqueue


class JobqueueBackend(Backend):
    """Workers as batch jobs through dask-jobqueue; one subclass per row of the batch systems' table names the system."""

    system: ClassVar[str] = ""
    #: ``session.start`` passes its ``wait`` (``--no-wait``): a start may return with the jobs queued
    takes_wait: ClassVar[bool] = True
    # batch queues: see docs/hpc.md
    cli_options = (
        WORKERS,
        THREADS,
        MEMORY_LIMIT,
        Option("partition", "the queue (partition) the jobs go to", None, "P"),
        Option("account", "the account the jobs are charged to", None, "A"),
        Option("walltime", "each job's time limit", None, "HH:MM:SS"),
        Option("gpus", "GPUs per worker job (slurm)", None, "N", kind="optional"),
        Option("job_extra", "more directives for the job script", None, "DIRECTIVE", kind="list"),
        HOST,
        Option("interface", "the network interface the scheduler listens on", None, "IF"),
        PORT,
        TLS,
        ADAPT_MIN,
        ADAPT_MAX,
        Option("dry_run", "print a worker's job script; submit nothing", kind="flag"),
    )
    api_options = ("name",)

    # -- hooks ---------------------------------------------------------------
    async def describe(self, model: dict[str, Any], extra: dict[str, Any], client: Any) -> None:
        """Each worker's job id, node and walltime left, and the pending jobs with the queue's reason (:func:`.facts.apply_facts`).

        The owner keeps them in the scheduler's metadata (:class:`.facts._Facts`); one more
        scheduler query, for clusters whose record says they are batch clusters.
        """
        import asyncio

        if not isinstance(extra.get("batch"), dict):
            return
        try:
            facts = await asyncio.wait_for(client.get_metadata(list(FACTS_KEY), default=None), 10)
        except (OSError, asyncio.TimeoutError, KeyError):
            return
        apply_facts(model, facts)

    def cleanup_orphan(self, record: ClusterRecord) -> None:
        """Cancel the jobs of a batch cluster whose owner died."""
        if isinstance(record.extra, dict):
            cancel_jobs(record.extra.get("batch"))

    # -- building ------------------------------------------------------------
    def _cluster_class(self) -> Any:
        try:
            dask_jobqueue = _import_dask_jobqueue()
        except ImportError as exc:
            raise ClusterError(
                f"the {self.name} backend needs dask-jobqueue, which is not installed; install it with: {INSTALL_HINT}"
            ) from exc
        return getattr(dask_jobqueue, SYSTEMS[self.system].cluster_class)

    def _kwargs(
        self, opts: dict[str, Any], job_name: str, security: Any, log_dir: str | None, cluster_name: str | None = None
    ) -> dict[str, Any]:
        """The keyword arguments of the dask-jobqueue cluster class for ``opts``."""
        import dask.config

        # a worker's HTTP server (dashboard, /metrics) would listen unauthenticated on every interface of the node
        worker_args = ["--no-dashboard", "--dashboard-address", "127.0.0.1:0"]
        extra = list(opts["job_extra"])
        if opts["gpus"]:
            extra.append(f"--gres=gpu:{opts['gpus']}")
            worker_args += ["--resources", f"GPU={opts['gpus']}"]
        scheduler_options: dict[str, Any] = dict(
            dask.config.get(f"jobqueue.{self.system}.scheduler-options", None) or {}
        )
        scheduler_options.setdefault("dashboard_address", "127.0.0.1:0")  # for the notebook only, not the nodes
        scheduler_options["port"] = opts["port"]
        if opts["host"]:
            scheduler_options["host"] = opts["host"]
        elif not opts["interface"] and "interface" not in scheduler_options and "host" not in scheduler_options:
            scheduler_options["host"] = reachable_host(self.system)
        kwargs: dict[str, Any] = dict(
            cores=opts["threads"],
            processes=1,
            memory=opts["memory"],
            walltime=opts["walltime"],
            job_name=job_name,
            job_extra_directives=extra,
            worker_extra_args=worker_args,
            # the notebook's own environment, unless the site names the nodes' Python
            python=dask.config.get(f"jobqueue.{self.system}.python", None) or sys.executable,
            death_timeout=int(config.timeout_seconds("jobqueue.death-timeout")),
            scheduler_options=scheduler_options,
            log_directory=log_dir,
            interface=opts["interface"],
            security=security,
            name=cluster_name,
        )
        if opts["partition"] is not None:
            kwargs["queue"] = opts["partition"]
        if opts["account"] is not None:
            kwargs[SYSTEMS[self.system].account_keyword] = opts["account"]
        if security is None:
            kwargs["protocol"] = "tcp://"
        return {k: v for k, v in kwargs.items() if v is not None}

    def dry_run(self, name: str | None = None, **options: Any) -> str:
        """The job script one worker's job would run (``%cluster start --backend slurm --dry-run``); nothing is submitted."""
        self.check_options(options)
        opts = resolve(self.system, options)
        cls = self._cluster_class()
        security = None
        if opts["tls"]:  # where the jobs will find the cluster's certificate (not written by a dry run)
            from distributed.security import Security

            pem = os.path.join(config.get("jobqueue.shared-directory") or "~/.jupyter-cluster/jobs", "JOB", "tls.pem")
            security = _job_security(Security(require_encryption=True), pem)
        kwargs = self._kwargs(opts, f"jc-{name or self.name}", security, None)
        kwargs["scheduler_options"] = dict(kwargs["scheduler_options"], host="127.0.0.1")  # binds nothing real
        kwargs.pop("interface", None)
        job = cls.job_cls(scheduler="tls://SCHEDULER:PORT", name="WORKER", config_name=self.system, **_job_only(kwargs))
        return job.job_script()

    # -- starting ------------------------------------------------------------
    def start(self, name: str | None = None, wait: bool = True, **options: Any) -> StartedCluster:
        """Submit the worker jobs; with ``wait`` (the default) return once the first worker connected.

        ``wait=False`` (``%cluster start --no-wait``) returns once the jobs are asked for: they may stay
        queued, and the cluster's job facts (widget, sidebar) tell why.
        """
        self.check_options(options)
        opts = resolve(self.system, options)
        cls = self._cluster_class()
        submit = SYSTEMS[self.system].submit
        if shutil.which(submit) is None:
            raise ClusterError(
                f"{submit} is not on PATH, so no {self.name} job can be submitted from here; "
                f"start the notebook on a machine where {self.name}'s commands work (a login node)."
            )
        name = name or f"{self.name}-{os.getpid()}"
        job_name = f"jc-{name}-{uuid.uuid4().hex[:6]}"
        folder = os.path.join(shared_directory(), job_name)
        os.makedirs(folder, mode=0o700)
        cleanup: list[Any] = [lambda: shutil.rmtree(folder, ignore_errors=True)]
        security = client_security = None
        try:
            if opts["tls"]:
                from ...state.credentials import forget_security, new_security, pem_path, written_identity

                client_security = new_security(name)
                identity = written_identity(name)
                cleanup.append(lambda: forget_security(name, identity))
                job_pem = os.path.join(folder, "tls.pem")
                _copy_private(pem_path(name), job_pem)
                security = _job_security(client_security, job_pem)
            kwargs = self._kwargs(opts, job_name, security, os.path.join(folder, "logs"), name)
            if self.system == "slurm":
                self._test_submit(cls, kwargs)
            watchdog = start_watchdog(job_name, folder) if self.system == "slurm" else None
            if watchdog is not None:
                cleanup.append(lambda: _end(watchdog))
            try:
                cluster = cls(**kwargs, job_cls=_recording_job_cls(cls.job_cls))
            except (OSError, RuntimeError, ValueError) as exc:
                raise ClusterError(f"the {self.name} cluster could not start: {exc}") from exc
            try:
                adapt = opts["adapt_min"] is not None
                # an adaptive cluster starts with one job at least: the start waits for a worker, and
                # adapting from none would cancel the jobs that have not arrived yet
                initial = max(opts["adapt_min"], 1) if adapt else opts["workers"]
                cluster.scale(jobs=initial)
                facts = _Facts(cluster, job_name, config.timeout_seconds("jobqueue.poll-interval"))
                if self.system == "slurm":
                    if wait:
                        self._wait_for_a_worker(cluster, facts, name, initial)
                    facts.start()
                    cleanup.insert(0, facts.stopped.set)
                if adapt:
                    cluster.adapt(minimum=opts["adapt_min"], maximum=opts["adapt_max"])
            except BaseException:
                with contextlib.suppress(Exception):
                    cluster.close(timeout=10)
                raise
        except BaseException:
            for fn in reversed(cleanup):
                with contextlib.suppress(Exception):
                    fn()
            raise
        return StartedCluster.of(
            cluster,
            security=client_security,
            cleanup=cleanup,
            extra={"batch": {"system": self.system, "job_name": job_name}},
        )

    def _test_submit(self, cls: Any, kwargs: dict[str, Any]) -> None:
        """Ask SLURM whether it would take the job (``sbatch --test-only``): its refusal, in one sentence, before anything runs."""
        job = cls.job_cls(
            scheduler="tls://127.0.0.1:1",
            name="test",
            config_name=self.system,
            **_job_only(dict(kwargs, log_directory=None)),
        )
        import tempfile

        with tempfile.NamedTemporaryFile("w", suffix=".sh", delete=False) as f:
            f.write(job.job_script())
        try:
            done = subprocess.run(
                ["sbatch", "--test-only", f.name], capture_output=True, text=True, timeout=30, check=False
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise ClusterError(f"sbatch could not be run ({exc}); check that SLURM's commands work here.") from exc
        finally:
            os.remove(f.name)
        if done.returncode != 0:
            why = _sbatch_why(done.stderr, done.returncode)
            raise ClusterError(
                f"SLURM refuses the worker jobs: {why}; check --partition, --walltime and the sizes asked for."
            )

    def _wait_for_a_worker(self, cluster: Any, facts: _Facts, name: str, jobs_asked: int) -> None:
        """Wait for the first worker; raise at once, with SLURM's reason, if the jobs will not start."""
        if not jobs_asked:
            return
        timeout = config.timeout_seconds("jobqueue.start-timeout")
        notice = config.timeout_seconds("jobqueue.pending-notice")
        t0 = time.monotonic()
        told = False
        gone = 0  # polls in a row that found none of the submitted jobs in the queue
        while True:
            if cluster.scheduler.workers:
                return
            failed = _submit_error(cluster)
            if failed is not None:
                # dask-jobqueue only logs a failed submit; waiting would last the whole start-timeout
                raise ClusterError(
                    f"sbatch did not queue the worker jobs of cluster {name!r}: {failed}; any that were queued "
                    "were cancelled, check your site's submit limits (or ask for fewer --workers)."
                )
            submitted = _submitted(cluster)  # before squeue: a job submitted meanwhile is not "gone"
            jobs = facts.poll()
            never = pending_reason(jobs)
            if never is not None:
                reason, meaning = never
                raise ClusterError(
                    f"SLURM will not start the jobs of cluster {name!r}: they are pending with reason {reason} "
                    f"({meaning}); the jobs were cancelled, change --partition, --walltime or the sizes asked for."
                )
            elapsed = time.monotonic() - t0
            gone = gone + 1 if submitted and not submitted & {j["job_id"] for j in jobs} else 0
            if gone >= 3 and not cluster.scheduler.workers:
                raise ClusterError(
                    f"the worker jobs of cluster {name!r} ended before a worker connected: {_job_error(cluster)}"
                )
            if elapsed > timeout:
                reasons = sorted({j["reason"] for j in jobs if j["state"] == "PENDING" and j["reason"]})
                why = f"pending with reason {', '.join(reasons)}" if reasons else "not connected"
                raise ClusterError(
                    f"no worker of cluster {name!r} connected within {timeout:g} s (its jobs are {why}); "
                    "the jobs were cancelled; raise jupyter-cluster.jobqueue.start-timeout or ask for fewer resources."
                )
            if not told and elapsed > notice and jobs and all(j["state"] == "PENDING" for j in jobs):
                reasons = sorted({j["reason"] for j in jobs if j["reason"]})
                print(
                    f"jupyter_cluster: the jobs of cluster {name!r} are pending in SLURM ({', '.join(reasons) or 'no reason given'}); "
                    f"waiting up to {timeout:g} s for the first worker.",
                    file=sys.stderr,
                    flush=True,
                )
                told = True
            time.sleep(0.5)


@functools.cache
def _recording_job_cls(job_cls: type) -> type:
    """``job_cls`` that keeps why its submission failed (``submit_error``) for :func:`_submit_error`.

    dask-jobqueue logs a failed submit command and keeps the job, without a
    ``job_id``, in ``cluster.workers``; the command's error is not kept.
    """

    class RecordingJob(job_cls):
        submit_error: str | None = None

        async def _submit_job(self, script_filename: str) -> str:
            try:
                return await super()._submit_job(script_filename)
            except RuntimeError as exc:  # dask-jobqueue's _call: exit code, command, stdout and stderr
                text = str(exc)
                stderr = text.split("\nstderr:\n", 1)[1] if "\nstderr:\n" in text else text
                code = re.search(r"Exit code: (-?\d+)", text)
                self.submit_error = _sbatch_why(stderr, int(code.group(1)) if code else 1)
                raise

    RecordingJob.__name__ = RecordingJob.__qualname__ = job_cls.__name__
    return RecordingJob


def _submit_error(cluster: Any) -> str | None:
    """Why a job of the cluster could not be submitted, or None.

    A job in ``cluster.workers`` has been through its submit; one without a
    ``job_id`` is one whose submit command failed.
    """
    for job in list(getattr(cluster, "workers", {}).values()):
        if not getattr(job, "job_id", None):
            return getattr(job, "submit_error", None) or "the submit command failed (no job id)"
    return None


def _submitted(cluster: Any) -> set[str]:
    """Ids of the jobs the cluster has submitted so far."""
    return {str(j.job_id) for j in list(getattr(cluster, "workers", {}).values()) if getattr(j, "job_id", None)}


def _job_error(cluster: Any) -> str:
    """The last line a worker job wrote to its error log, to say why the jobs ended."""
    jobs = list(getattr(cluster, "workers", {}).values())
    log_dir = getattr(jobs[0], "log_directory", None) if jobs else None
    if log_dir and os.path.isdir(log_dir):
        for entry in sorted(os.listdir(log_dir)):
            if entry.endswith(".err"):
                with open(os.path.join(log_dir, entry), errors="replace") as f:
                    lines = [ln.strip() for ln in f.read().splitlines() if ln.strip()]
                if lines:
                    return f"{lines[-1]} (from {os.path.join(log_dir, entry)})."
    return "no job is queued or running any more, and none left an error log."


def _job_only(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments a dask-jobqueue Job takes (not the cluster's own)."""
    return {k: v for k, v in kwargs.items() if k not in ("scheduler_options", "security", "protocol", "name")} | {
        "protocol": kwargs.get("protocol", "tls://"),
        "security": kwargs.get("security"),
    }


def _end(proc: subprocess.Popen) -> None:
    with contextlib.suppress(OSError):
        proc.kill()
    with contextlib.suppress(Exception):
        proc.wait(timeout=5)


def _backend_class(system: BatchSystem) -> type[JobqueueBackend]:
    """The backend of one batch system: :class:`JobqueueBackend` named after the table's row."""
    attrs = {
        "__module__": __name__,
        "__qualname__": system.backend,
        "__doc__": f"{system.title} through dask-jobqueue's ``{system.cluster_class}`` ({system.checked}).",
        "name": system.name,
        "system": system.name,
    }
    return cast("type[JobqueueBackend]", type(system.backend, (JobqueueBackend,), attrs))


# one per row of the table; the backends' registry names them (``backends._BUILTIN``)
SlurmBackend = _backend_class(SYSTEMS["slurm"])
PBSBackend = _backend_class(SYSTEMS["pbs"])
SGEBackend = _backend_class(SYSTEMS["sge"])
LSFBackend = _backend_class(SYSTEMS["lsf"])
