"""Batch-queue clusters: SLURM (and PBS, SGE, LSF) through dask-jobqueue.

Each worker is one batch job that dask-jobqueue's ``SLURMCluster`` (``PBSCluster``,
``SGECluster``, ``LSFCluster``) writes and submits; the scheduler runs in the
notebook's process.  This module adds what a notebook user needs around it:

* options with site defaults from dask.config (``jupyter-cluster.jobqueue.*``,
  then dask-jobqueue's own ``jobqueue.<system>.*``), checked before any job is
  submitted (:func:`resolve`), and ``--dry-run`` to print the job script;
* TLS by default: one certificate per cluster, in 0600 files in a 0700 folder
  the jobs read (``jupyter-cluster.jobqueue.shared-directory``, in the home
  directory by default, which batch nodes share);
* a scheduler bound to the address the batch nodes reach: the one this machine
  uses towards the SLURM controller (:func:`reachable_host`), since jobs on other
  nodes must connect to it -- TLS and the 0600 credentials keep everyone else out;
* jobs that will not start are reported in one sentence with SLURM's own
  reason (``squeue %r``, or ``sbatch --test-only``'s error) within seconds
  (:func:`pending_reason`), and cancelled;
* no job outlives the notebook: ``%cluster stop`` cancels them (dask-jobqueue),
  a watchdog process cancels them when the kernel dies (kill -9 included), the
  registry cancels a dead owner's jobs when it drops its record
  (:func:`cancel_jobs`), and each worker exits when its scheduler is gone
  (``--death-timeout``);
* facts for the sidebar: each worker's job id, node and walltime left, and
  pending jobs with SLURM's reason (:func:`slurm_jobs`), kept in the scheduler's
  metadata under :data:`FACTS_KEY` for the Jupyter server to read.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any, ClassVar

from .. import config
from ..errors import ClusterError
from . import Backend, StartedCluster

if TYPE_CHECKING:
    from ..state.registry import ClusterRecord

INSTALL_HINT = "pip install 'jupyter-cluster[hpc]'"
#: where the scheduler keeps the batch facts the sidebar shows (``Scheduler.get_metadata``)
FACTS_KEY = ["jupyter-cluster", "batch"]


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


#: system -> (dask_jobqueue class, submit command, cancel command)
SYSTEMS: dict[str, tuple[str, str, str]] = {
    "slurm": ("SLURMCluster", "sbatch", "scancel"),
    "pbs": ("PBSCluster", "qsub", "qdel"),
    "sge": ("SGECluster", "qsub", "qdel"),
    "lsf": ("LSFCluster", "bsub", "bkill"),
}

#: SLURM pending reasons (squeue %r) after which a job never starts by itself, and what they mean
NEVER_STARTS = {
    "PartitionTimeLimit": "the walltime is over the partition's limit",
    "PartitionNodeLimit": "it asks for more nodes than the partition allows",
    "PartitionDown": "the partition is down",
    "PartitionInactive": "the partition is inactive",
    "InvalidAccount": "the account is not valid",
    "InvalidQOS": "the QOS is not valid",
    "BadConstraints": "no node has the features or resources asked for",
    "QOSMaxWallDurationPerJobLimit": "the walltime is over the QOS's limit",
    "AssocMaxWallDurationPerJobLimit": "the walltime is over the account's limit",
    "QOSMaxCpuPerJobLimit": "it asks for more CPUs than the QOS allows",
    "AssocGrpCpuLimit": "the account's CPU limit is reached",
    "JobHeldAdmin": "an administrator holds it",
    "DependencyNeverSatisfied": "a dependency can never be satisfied",
}

_JOB_NAME_RE = re.compile(r"jc-[A-Za-z0-9_.-]{1,80}")
_WORD_RE = re.compile(r"[A-Za-z0-9_.,:@+=/-]+")
_WALLTIME_RE = re.compile(r"(\d+-)?\d+(:\d{1,2}){0,2}")


# -- options -------------------------------------------------------------------------
def _setting(system: str, key: str, jq_key: str | None = None) -> Any:
    """``jupyter-cluster.jobqueue.<key>``, else dask-jobqueue's ``jobqueue.<system>.<jq_key>``."""
    import dask.config

    value = config.get(f"jobqueue.{key}")
    if value is None and jq_key is not None:
        value = dask.config.get(f"jobqueue.{system}.{jq_key}", None)
    return value


def _word(value: Any, flag: str) -> str:
    """A value that goes into a job script's header: one word, no spaces or line breaks."""
    text = str(value)
    if not _WORD_RE.fullmatch(text):
        raise ClusterError(
            f"{flag} {value!r} is not one word of letters, digits and .,:@+=/-; write it like {flag} gpu."
        )
    return text


def _walltime(value: Any, lsf: bool = False) -> str:
    text = str(value).strip()
    if not _WALLTIME_RE.fullmatch(text):
        raise ClusterError(
            f"--walltime {value!r} is not a time limit; write it like 2:00:00 (hours:minutes:seconds), 30 (minutes) or 1-12 (days-hours)."
        )
    if lsf:  # bsub -W takes [hours:]minutes
        if "-" in text:
            raise ClusterError(f"--walltime {value!r}: LSF takes hours:minutes, like 36:00, not days.")
        parts = [int(p) for p in text.split(":")]
        if len(parts) == 3:
            hours, minutes, seconds = parts
            minutes += 1 if seconds else 0
            text = f"{hours + minutes // 60}:{minutes % 60:02d}"
    return text


def _job_extra(value: Any) -> list[str]:
    if value is None:
        return []
    items = [value] if isinstance(value, str) else list(value)
    out = []
    for item in items:
        text = str(item).strip()
        if not text or "\n" in text or "\r" in text:
            raise ClusterError(
                f"--job-extra {item!r} must be one directive on one line, like --job-extra=--constraint=a100."
            )
        out.append(text)
    return out


def _gpus(value: Any) -> int:
    if value in (None, False):
        return 0
    if value is True:
        return 1
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ClusterError(f"--gpus {value!r} is not a number of GPUs per worker; write it like --gpus 1.") from None
    if n < 0:
        raise ClusterError("--gpus must be 0 or more GPUs per worker.")
    return n


def resolve(system: str, options: dict[str, Any]) -> dict[str, Any]:
    """The options of a ``system`` cluster with site defaults filled in, checked (nothing is submitted).

    Parameters
    ----------
    system : str
        ``"slurm"``, ``"pbs"``, ``"sge"`` or ``"lsf"``.
    options : dict
        What ``%cluster start`` or :func:`jupyter_cluster.start` was given.

    Returns
    -------
    dict
        ``workers``, ``threads``, ``memory``, ``partition``, ``account``,
        ``walltime``, ``gpus``, ``job_extra``, ``host``, ``interface``, ``port``,
        ``tls``, ``adapt_min``, ``adapt_max``.
    """
    from ..wire.models import validate_count, validate_size

    def pick(key: str, cfg: str, jq: str | None = None) -> Any:
        value = options.get(key)
        return _setting(system, cfg, jq) if value is None else value

    workers = validate_count(pick("workers", "workers"), "--workers")
    threads = pick("threads", "threads", "cores")
    threads = validate_count(1 if threads is None else threads, "--threads", minimum=1)
    memory = pick("memory_limit", "memory", "memory") or "2GiB"
    validate_size(memory, "--memory-limit")
    if memory == "auto":
        raise ClusterError('--memory-limit for a batch job must be a size such as "4GiB", not "auto".')
    partition = pick("partition", "partition", "queue")
    account = pick("account", "account", "account")
    walltime = pick("walltime", "walltime", "walltime")
    gpus = _gpus(options.get("gpus") if options.get("gpus") is not None else config.get("jobqueue.gpus"))
    if gpus and system != "slurm":
        raise ClusterError(
            f"--gpus is offered for slurm only; ask {system} for GPUs with --job-extra in its own directive syntax."
        )
    adapt_min, adapt_max = options.get("adapt_min"), options.get("adapt_max")
    if adapt_min is not None or adapt_max is not None:
        adapt_min = int(adapt_min or 0)
        adapt_max = int(adapt_max) if adapt_max is not None else max(adapt_min, workers, 1)
        if adapt_min < 0 or adapt_max < adapt_min:
            raise ClusterError("adaptivity needs 0 <= --adapt-min <= --adapt-max.")
    port = options.get("port")
    if port is not None and not (isinstance(port, int) and 0 <= port <= 65535):
        raise ClusterError(f"--port must be a TCP port from 0 to 65535 (0 or none picks a free one), not {port}.")
    tls = pick("tls", "tls")
    return {
        "workers": workers,
        "threads": threads,
        "memory": memory,
        "partition": None if partition is None else _word(partition, "--partition"),
        "account": None if account is None else _word(account, "--account"),
        "walltime": None if walltime is None else _walltime(walltime, lsf=system == "lsf"),
        "gpus": gpus,
        "job_extra": _job_extra(config.get("jobqueue.job-extra")) + _job_extra(options.get("job_extra")),
        "host": pick("host", "host"),
        "interface": pick("interface", "interface", "interface"),
        "port": port or 0,
        "tls": True if tls is None else bool(tls),
        "adapt_min": adapt_min,
        "adapt_max": adapt_max,
    }


# -- where the scheduler listens ------------------------------------------------------------
def _controller_address(system: str) -> str | None:
    """The SLURM controller's address (``scontrol show config``'s SlurmctldHost), or None."""
    if system != "slurm" or shutil.which("scontrol") is None:
        return None
    try:
        out = subprocess.run(
            ["scontrol", "show", "config"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"^SlurmctldHost\[0\]\s*=\s*([^\s(]+)(?:\(([^)]+)\))?", out, re.M)
    if match is None:
        return None
    return match.group(2) or match.group(1)


def reachable_host(system: str) -> str:
    """The address of this machine that the batch nodes reach.

    A job on another node connects to the scheduler, so it must not listen on
    loopback.  The nodes talk to the SLURM controller, so the address this
    machine uses towards the controller is on the network they share (asking
    the kernel's routing table through an unconnected UDP socket sends
    nothing).  Elsewhere (PBS, SGE, LSF, no ``scontrol``): the address the
    host name resolves to, else the one towards the default route.
    """
    targets = [t for t in (_controller_address(system),) if t]
    with contextlib.suppress(OSError):
        name_ip = socket.gethostbyname(socket.gethostname())
        if not name_ip.startswith("127."):
            targets.append(name_ip)
    targets.append("192.0.2.1")  # TEST-NET-1: only the default route's source address is wanted
    for target in targets:
        try:
            ip = socket.getaddrinfo(target, None, socket.AF_INET)[0][4][0]
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((ip, 9))
                return s.getsockname()[0]
        except OSError:
            continue
    return "127.0.0.1"


# -- credentials the jobs read ------------------------------------------------------------
def shared_directory() -> str:
    """The folder the jobs read credentials from and write logs to: 0700, this user's.

    ``jupyter-cluster.jobqueue.shared-directory``; by default in the home
    directory, which batch nodes mount.
    """
    path = os.path.expanduser(os.path.expandvars(config.get("jobqueue.shared-directory") or "~/.jupyter-cluster/jobs"))
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if not os.path.isdir(path) or st.st_uid != os.getuid():
        raise ClusterError(
            f"{path} is not a folder of this user; set jupyter-cluster.jobqueue.shared-directory to a private folder the batch nodes see."
        )
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, 0o700)
    return path


def _job_security(security: Any, pem: str) -> Any:
    """``security`` with every key and certificate read from ``pem`` (the copy the jobs see)."""
    from distributed.security import Security

    fields = {k: getattr(security, k) for k in ("require_encryption",)}
    fields["tls_ca_file"] = pem
    for role in ("client", "scheduler", "worker"):
        fields[f"tls_{role}_cert"] = pem
        fields[f"tls_{role}_key"] = pem
    return Security(**fields)


def _copy_private(src: str, dst: str) -> None:
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f, open(src) as s:
        f.write(s.read())
    os.chmod(dst, 0o600)


# -- jobs ------------------------------------------------------------------------------
def slurm_jobs(job_name: str) -> list[dict[str, Any]]:
    """This user's SLURM jobs named ``job_name``: id, state, reason, node, walltime left.

    Returns
    -------
    list of dict
        ``{"job_id": str, "state": "PENDING"|"RUNNING"|..., "reason": str,
        "node": str|None, "walltime_left": str|None}``, from ``squeue``.
    """
    if not _JOB_NAME_RE.fullmatch(job_name):
        return []
    try:
        out = subprocess.run(
            ["squeue", "-h", "--name", job_name, "-u", _user(), "-o", "%i|%T|%r|%N|%L"],
            capture_output=True,
            text=True,
            timeout=15,
            check=False,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    jobs = []
    for line in out.splitlines():
        parts = line.split("|")
        if len(parts) != 5:
            continue
        job_id, state, reason, node, left = parts
        jobs.append(
            {
                "job_id": job_id,
                "state": state,
                "reason": "" if reason in ("None", "(null)") else reason,
                "node": node or None,
                "walltime_left": None if left in ("", "INVALID", "NOT_SET", "UNLIMITED") else left,
            }
        )
    return jobs


def _user() -> str:
    import getpass

    return getpass.getuser()


def pending_reason(jobs: list[dict[str, Any]]) -> tuple[str, str] | None:
    """The first reason among ``jobs`` after which SLURM never starts a job by itself: (reason, meaning), or None."""
    for job in jobs:
        if job["state"] == "PENDING":
            for reason in re.split(r"[,\s]+", job["reason"]):
                if reason in NEVER_STARTS:
                    return reason, NEVER_STARTS[reason]
    return None


_CANCELS: list[subprocess.Popen] = []


def cancel_jobs(info: Any) -> None:
    """Cancel every job of a cluster whose owner died (called by the registry when it drops the record).

    ``info`` is the record's ``extra["batch"]``: only a known system and a job
    name of ours are used, to build the cancel command here (a record names
    nothing that is run).
    """
    if not isinstance(info, dict):
        return
    system, job_name = info.get("system"), info.get("job_name")
    if system != "slurm" or not isinstance(job_name, str) or not _JOB_NAME_RE.fullmatch(job_name):
        return
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        # not waited for: the Jupyter server calls this on its event loop, and a busy slurmctld may
        # take seconds to answer (subprocess reaps the finished process at a later Popen)
        _CANCELS[:] = [p for p in _CANCELS if p.poll() is None]  # kept until done: no warning, no zombie
        _CANCELS.append(
            subprocess.Popen(
                ["scancel", "--name", job_name, "-u", _user()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    # the credentials and logs the jobs were given (a folder named after the checked job name, in this
    # user's own job folder: never a path the record names)
    with contextlib.suppress(OSError, ClusterError):
        folder = os.path.join(shared_directory(), job_name)
        st = os.lstat(folder)
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid():
            shutil.rmtree(folder, ignore_errors=True)


def cleanup_orphan(record: ClusterRecord) -> None:
    """The registry's clean-up hook for a batch cluster whose owner died (see :mod:`jupyter_cluster.state.orphans`)."""
    if isinstance(record.extra, dict):
        cancel_jobs(record.extra.get("batch"))


#: The watchdog: a small process (standard library only) that waits for the notebook's process to
#: end, however it ends, and then cancels the cluster's jobs (pending ones too, which no worker's
#: death timeout ends) and deletes the credentials and logs the jobs were given.
_WATCHDOG = r"""
import os, shutil, subprocess, sys, time
pid, started, job_name, user, folder = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
def alive():
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0] != "Z" and fields[19] == started
    except (OSError, IndexError):
        return False
while alive():
    time.sleep(1.0)
if os.path.isdir(folder):
    subprocess.run(["scancel", "--name", job_name, "-u", user], capture_output=True, timeout=60)
    shutil.rmtree(folder, ignore_errors=True)
"""


def _proc_start(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def start_watchdog(job_name: str, folder: str) -> subprocess.Popen | None:
    """Start the process that cancels the jobs named ``job_name`` once this process has ended (Linux).

    It ends by itself once ``folder`` (the cluster's job folder) is gone: a
    stopped cluster deletes it, so the watchdog then cancels nothing.
    """
    started = _proc_start(os.getpid())
    if started is None:
        return None
    return subprocess.Popen(
        [sys.executable, "-I", "-c", _WATCHDOG, str(os.getpid()), started, job_name, _user(), folder],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # not in the kernel's process group: a kernel's shutdown signals that group
        close_fds=True,
    )


# -- the backend ------------------------------------------------------------------------
class _Facts(threading.Thread):
    """Polls ``squeue`` for the cluster's jobs and keeps the facts in the scheduler's metadata."""

    def __init__(self, cluster: Any, job_name: str, interval: float):
        super().__init__(daemon=True, name="jupyter-cluster-batch-facts")
        self.cluster = cluster
        self.job_name = job_name
        self.interval = interval
        self.stopped = threading.Event()
        self.jobs: list[dict[str, Any]] = []

    def facts(self) -> dict[str, Any]:
        """Jobs as the sidebar shows them, each with its worker's name where it has one."""
        by_id = {}
        for worker_name, job in list(getattr(self.cluster, "workers", {}).items()):
            job_id = getattr(job, "job_id", None)
            if job_id:
                by_id[str(job_id)] = str(worker_name)
        jobs = [dict(j, worker=by_id.get(j["job_id"])) for j in self.jobs]
        return {"system": "slurm", "job_name": self.job_name, "updated": time.time(), "jobs": jobs}

    def publish(self) -> None:
        scheduler = getattr(self.cluster, "scheduler", None)
        if scheduler is None or not hasattr(scheduler, "set_metadata"):
            return
        facts = self.facts()
        # the scheduler lives on the cluster's event loop: its state changes there
        self.cluster.loop.add_callback(scheduler.set_metadata, keys=list(FACTS_KEY), value=facts)

    def poll(self) -> list[dict[str, Any]]:
        self.jobs = slurm_jobs(self.job_name)
        with contextlib.suppress(Exception):  # a closing cluster: nothing to tell
            self.publish()
        return self.jobs

    def run(self) -> None:
        # the first look soon (a --no-wait start's queued jobs and their reason), then every interval
        wait = min(self.interval, 1.0)
        while not self.stopped.wait(wait):
            if getattr(getattr(self.cluster, "status", None), "name", "") in ("closing", "closed"):
                return
            self.poll()
            wait = self.interval


class JobqueueBackend(Backend):
    """Workers as batch jobs through dask-jobqueue; subclasses name the system."""

    system: ClassVar[str] = ""
    #: ``session.start`` passes its ``wait`` (``--no-wait``): a start may return with the jobs queued
    takes_wait: ClassVar[bool] = True
    options = (
        "name",
        "workers",
        "threads",
        "memory_limit",
        "partition",
        "account",
        "walltime",
        "gpus",
        "job_extra",
        "host",
        "interface",
        "port",
        "tls",
        "adapt_min",
        "adapt_max",
    )

    # -- building ------------------------------------------------------------
    def _cluster_class(self) -> Any:
        try:
            dask_jobqueue = _import_dask_jobqueue()
        except ImportError as exc:
            raise ClusterError(
                f"the {self.name} backend needs dask-jobqueue, which is not installed; install it with: {INSTALL_HINT}"
            ) from exc
        return getattr(dask_jobqueue, SYSTEMS[self.system][0])

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
            kwargs["account" if self.system in ("slurm", "pbs") else "project"] = opts["account"]
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
        submit = SYSTEMS[self.system][1]
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
                from ..state.credentials import forget_security, new_security, pem_path, written_identity

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
        dashboard = getattr(cluster, "dashboard_link", None)
        return StartedCluster(
            address=cluster.scheduler_address,
            dashboard_link=dashboard,
            cluster=cluster,
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


def _sbatch_why(stderr: str, returncode: int) -> str:
    """sbatch's error lines, without their ``sbatch: error:`` prefix, as one clause."""
    lines = [ln.removeprefix("sbatch: error: ").strip() for ln in stderr.splitlines() if ln.strip()]
    return "; ".join(dict.fromkeys(lines)).rstrip(".") or f"sbatch exited with {returncode}"


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


class SlurmBackend(JobqueueBackend):
    """SLURM through dask-jobqueue's ``SLURMCluster`` (tested against a real SLURM)."""

    name = "slurm"
    system = "slurm"


class PBSBackend(JobqueueBackend):
    """PBS through ``PBSCluster`` (job scripts checked in tests; no real PBS runs there)."""

    name = "pbs"
    system = "pbs"


class SGEBackend(JobqueueBackend):
    """SGE through ``SGECluster`` (job scripts checked in tests; no real SGE runs there)."""

    name = "sge"
    system = "sge"


class LSFBackend(JobqueueBackend):
    """LSF through ``LSFCluster`` (job scripts checked in tests; no real LSF runs there)."""

    name = "lsf"
    system = "lsf"


# -- the sidebar's view ------------------------------------------------------------------
_FACT_TEXT = re.compile(r"[A-Za-z0-9_.,:()\[\]+-]{0,200}")


def _fact(value: Any) -> str | None:
    """A text from the facts (they come over the wire): short and plain, else None."""
    return value if isinstance(value, str) and _FACT_TEXT.fullmatch(value) else None


def apply_facts(model: dict[str, Any], facts: Any) -> None:
    """Add a batch cluster's job facts to a cluster model (the panel's detail view), in place.

    Each worker row whose job is known gets ``job_id``, ``node`` and
    ``walltime_left`` (SLURM's ``[days-]hours:minutes:seconds``); the model
    gets ``batch``: ``system``, ``updated`` (when squeue was asked, epoch
    seconds), ``running`` and ``pending`` job counts, ``pending_jobs`` (each
    ``job_id``, ``reason``: SLURM's own word, e.g. ``Resources`` or
    ``PartitionTimeLimit``) and ``walltime_left`` (the shortest of the
    running jobs', or None).  ``facts`` is what :class:`_Facts` keeps in the
    scheduler's metadata; anything malformed is left out.
    """
    if not isinstance(facts, dict) or not isinstance(facts.get("jobs"), (list, tuple)):
        return
    by_worker: dict[str, dict[str, Any]] = {}
    pending = []
    running = 0
    left: list[str] = []
    for job in facts["jobs"]:
        if not isinstance(job, dict) or _fact(job.get("job_id")) is None:
            continue
        state = _fact(job.get("state")) or ""
        if state == "PENDING":
            pending.append({"job_id": job["job_id"], "reason": _fact(job.get("reason")) or ""})
            continue
        if state == "RUNNING":
            running += 1
            if _fact(job.get("walltime_left")):
                left.append(job["walltime_left"])
        worker = _fact(job.get("worker"))
        if worker:
            by_worker[worker] = job
    for row in model.get("workers", []):
        job = by_worker.get(str(row.get("name")))
        if job is not None:
            row["job_id"] = job["job_id"]
            row["node"] = _fact(job.get("node"))
            row["walltime_left"] = _fact(job.get("walltime_left"))
    updated = facts.get("updated")
    model["batch"] = {
        "system": _fact(facts.get("system")) or "",
        "updated": float(updated) if isinstance(updated, (int, float)) else None,
        "running": running,
        "pending": len(pending),
        "pending_jobs": pending,
        "walltime_left": min(left, key=_seconds) if left else None,
    }


def _seconds(walltime: str) -> int:
    """SLURM's ``[days-][[hours:]minutes:]seconds`` in seconds (for picking the shortest)."""
    days, _, rest = walltime.rpartition("-")
    total = 0
    for part in rest.split(":"):
        total = total * 60 + (int(part) if part.isdigit() else 0)
    return total + (int(days) * 86400 if days.isdigit() else 0)
