"""SLURM's own commands: its queue (``squeue``), why a job never starts, ``scancel`` of a dead owner's jobs.

Also the watchdog process that cancels a cluster's jobs once the notebook's process has
ended (kill -9 included), and the controller's address the scheduler binds towards.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import subprocess
import sys
from typing import Any

from ...errors import ClusterError
from .credentials import shared_directory

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


def controller_address(system: str) -> str | None:
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


def _sbatch_why(stderr: str, returncode: int) -> str:
    """sbatch's error lines, without their ``sbatch: error:`` prefix, as one clause."""
    lines = [ln.removeprefix("sbatch: error: ").strip() for ln in stderr.splitlines() if ln.strip()]
    return "; ".join(dict.fromkeys(lines)).rstrip(".") or f"sbatch exited with {returncode}"
