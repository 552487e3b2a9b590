"""The batch-queue backends without a queue: job scripts (PBS, SGE, LSF, SLURM) and bad input.

No real PBS, SGE or LSF runs in these tests (docs/hpc.md says so): what is checked is the job
script dask-jobqueue writes for our options (``--dry-run`` prints it, nothing is submitted), and
that bad options are refused in one sentence before anything is submitted.  SLURM itself runs
for real in tests/backends/test_slurm.py.
"""

from __future__ import annotations

import importlib.util
import os
import re
import stat

import pytest

import jupyter_cluster as jc
from jupyter_cluster.backends import jobqueue
from jupyter_cluster.backends.jobqueue import credentials as jobqueue_files
from jupyter_cluster.backends.jobqueue import slurm as jobqueue_slurm
from jupyter_cluster.errors import ClusterError

# Not importorskip: importing dask_jobqueue here, at collection, would replace the test process's SIGINT
# handler with sys.exit for every later test; the backend imports it through jobqueue.backend._import_dask_jobqueue.
if importlib.util.find_spec("dask_jobqueue") is None:
    pytest.skip("dask-jobqueue is not installed (the hpc extra)", allow_module_level=True)

OPTIONS = dict(
    workers=1,
    partition="long",
    account="proj1",
    walltime="2:00:30",
    threads=4,
    memory_limit="8GiB",
    job_extra=["-l place=scatter"],
)


def script(backend: str, **options) -> str:
    return jc.start(backend=backend, dry_run=True, **{**OPTIONS, **options})


def worker_line(text: str) -> str:
    (line,) = [ln for ln in text.splitlines() if "distributed.cli.dask_worker" in ln]
    return line


@pytest.mark.parametrize(
    "backend, directives",
    [
        (
            "slurm",
            ["#SBATCH -p long", "#SBATCH -A proj1", "#SBATCH --cpus-per-task=4", "#SBATCH -t 2:00:30"],
        ),
        ("pbs", ["#PBS -q long", "#PBS -A proj1", "#PBS -l select=1:ncpus=4:mem=", "#PBS -l walltime=2:00:30"]),
        ("sge", ["#$ -q long", "#$ -P proj1", "#$ -l h_rt=2:00:30"]),
        ("lsf", ["#BSUB -q long", '#BSUB -P "proj1"', "#BSUB -n 4", "#BSUB -W 2:01"]),  # LSF: hours:minutes
    ],
)
def test_job_scripts_carry_the_options_tls_and_the_watchdog(backend, directives):
    text = script(backend)
    prefix = directives[0].split()[0]
    for directive in directives:
        assert any(ln.startswith(directive) for ln in text.splitlines()), (directive, text)
    assert f"{prefix} -l place=scatter" in text  # --job-extra, as its own directive
    assert re.search(rf"^{re.escape(prefix)} -[JN] jc-{backend}-", text, re.M), text  # named, for scancel by name
    line = worker_line(text)
    # TLS by default, the certificate from the cluster's private job folder
    assert "--protocol tls://" in line and "--tls-ca-file" in line and "/JOB/tls.pem" in line, line
    # a worker whose scheduler is gone ends its job; its HTTP server stays on the node's loopback
    assert "--death-timeout 60" in line and "--dashboard-address 127.0.0.1:0" in line and "--no-dashboard" in line
    assert "--nthreads 4" in line and "--memory-limit 8.00GiB" in line


def test_slurm_gpus_become_gres_and_a_dask_resource():
    text = script("slurm", gpus=2, job_extra=None)
    assert "#SBATCH --gres=gpu:2" in text
    assert "--resources GPU=2" in worker_line(text)


def test_no_tls_is_plain_tcp():
    line = worker_line(script("slurm", tls=False))
    assert "--protocol tcp://" in line and "--tls" not in line


def test_site_defaults_come_from_dask_config():
    import dask.config

    with dask.config.set({"jupyter-cluster.jobqueue.partition": "site-gpu", "jobqueue.slurm.account": "lab7"}):
        text = jc.start(backend="slurm", dry_run=True)
    assert "#SBATCH -p site-gpu" in text and "#SBATCH -A lab7" in text


@pytest.mark.parametrize(
    "options, words",
    [
        ({"walltime": "2h"}, "--walltime '2h' is not a time limit"),
        ({"partition": "gpu; rm -rf ~"}, "--partition 'gpu; rm -rf ~' is not one word"),
        ({"account": "a\nb"}, "--account"),
        ({"job_extra": ["--mem=1G\n#SBATCH --x"]}, "must be one directive on one line"),
        ({"memory_limit": "lots"}, "--memory-limit must be a size"),
        ({"memory_limit": "auto"}, 'must be a size such as "4GiB", not "auto"'),
        ({"threads": 0}, "--threads must be a whole number from 1"),
        ({"gpus": "two"}, "--gpus 'two' is not a number of GPUs"),
        ({"port": 70000}, "--port must be a TCP port"),
        ({"adapt_min": 3, "adapt_max": 1}, "0 <= --adapt-min <= --adapt-max"),
        ({"image": "x"}, "the slurm backend does not take --image"),
    ],
)
def test_bad_options_are_one_sentence_before_anything_is_submitted(options, words):
    with pytest.raises(ClusterError) as err:
        jc.start(backend="slurm", dry_run=True, **options)
    assert words in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_gpus_are_slurm_only():
    with pytest.raises(ClusterError, match="--gpus is offered for slurm only"):
        script("pbs", gpus=1)


def test_a_system_whose_commands_are_missing_says_so(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ClusterError) as err:
        jc.start(backend="pbs", workers=1)
    assert "qsub is not on PATH" in str(err.value) and "login node" in str(err.value)
    assert not jc.cluster.session.handles()


def test_the_job_folder_is_private(tmp_path):
    import dask.config

    with dask.config.set({"jupyter-cluster.jobqueue.shared-directory": str(tmp_path / "jobs")}):
        path = jobqueue.shared_directory()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    src = tmp_path / "src.pem"
    src.write_text("secret")
    jobqueue_files._copy_private(str(src), os.path.join(path, "tls.pem"))
    assert stat.S_IMODE(os.stat(os.path.join(path, "tls.pem")).st_mode) == 0o600


def test_never_starting_pending_reasons():
    jobs = [
        {"job_id": "1", "state": "PENDING", "reason": "Resources"},
        {"job_id": "2", "state": "PENDING", "reason": "PartitionTimeLimit"},
    ]
    assert jobqueue.pending_reason(jobs) == ("PartitionTimeLimit", "the walltime is over the partition's limit")
    assert jobqueue.pending_reason(jobs[:1]) is None  # waiting for resources: it may start


def test_cancel_jobs_runs_nothing_a_record_names(tmp_path, monkeypatch):
    """A registry record only names a system and a job name; neither becomes a command line of its choosing.

    ``scancel`` here is a script that writes down its arguments: a well-formed record runs it with our
    job name and user, a malformed one runs nothing and deletes nothing."""
    import dask.config

    calls = tmp_path / "calls"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scancel").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    (bin_dir / "scancel").chmod(0o700)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    shared = tmp_path / "jobs"
    with dask.config.set({"jupyter-cluster.jobqueue.shared-directory": str(shared)}):
        jobs = jobqueue.shared_directory()
        keep = os.path.join(jobs, "keep")
        os.makedirs(keep)
        for info in (
            {"system": "slurm", "job_name": "x; touch /tmp/owned"},
            {"system": "sh", "job_name": "jc-a"},
            {"system": "slurm", "job_name": "--all"},
            {"system": "slurm", "job_name": "jc-a/../../keep"},
            {"system": "slurm", "job_name": ["jc-a"]},
            "jc-a",
        ):
            jobqueue.cancel_jobs(info)  # refused before anything runs (no scancel of another's jobs)
        for proc in list(jobqueue_slurm._CANCELS):
            proc.wait(timeout=30)
        assert not calls.exists(), calls.read_text()
        assert os.path.isdir(keep)
        # the control: a record of ours cancels its jobs by name and deletes its job folder
        mine = os.path.join(jobs, "jc-a-1f2e3d")
        os.makedirs(mine)
        jobqueue.cancel_jobs({"system": "slurm", "job_name": "jc-a-1f2e3d"})
        for proc in list(jobqueue_slurm._CANCELS):
            proc.wait(timeout=30)
    assert calls.read_text().split() == ["--name", "jc-a-1f2e3d", "-u", jobqueue_slurm._user()]
    assert not os.path.exists(mine) and os.path.isdir(keep)


def test_job_facts_for_the_sidebar():
    """squeue's facts become worker fields and a ``batch`` summary; malformed entries are left out."""
    model = {"workers": [{"name": "c-0"}, {"name": "c-1"}]}
    facts = {
        "system": "slurm",
        "updated": 5.0,
        "jobs": [
            {"job_id": "7", "state": "RUNNING", "node": "node1", "walltime_left": "1:02:03", "worker": "c-0"},
            {"job_id": "8", "state": "RUNNING", "node": "node2", "walltime_left": "59:00", "worker": "c-1"},
            {"job_id": "9", "state": "PENDING", "reason": "Resources", "worker": "c-2"},
            {"job_id": "<script>", "state": "PENDING", "reason": "x"},
            "junk",
        ],
    }
    jobqueue.apply_facts(model, facts)
    assert model["workers"][0] == {"name": "c-0", "job_id": "7", "node": "node1", "walltime_left": "1:02:03"}
    assert model["workers"][1]["job_id"] == "8"
    assert model["batch"] == {
        "system": "slurm",
        "updated": 5.0,
        "running": 2,
        "pending": 1,
        "pending_jobs": [{"job_id": "9", "reason": "Resources"}],
        "walltime_left": "59:00",
    }
    untouched = {"workers": [{"name": "c-0"}]}
    jobqueue.apply_facts(untouched, None)
    assert untouched == {"workers": [{"name": "c-0"}]}


def test_loading_dask_jobqueue_leaves_ctrl_c_alone_and_works_off_the_main_thread():
    # dask_jobqueue.runner sets SIGINT to sys.exit at import time (and fails to import off the main
    # thread); a kernel's stop button must still raise KeyboardInterrupt after a SLURM start.
    import subprocess
    import sys

    code = (
        "import signal, threading\n"
        "from jupyter_cluster.backends import jobqueue\n"
        "before = signal.getsignal(signal.SIGINT)\n"
        "box = []\n"
        "t = threading.Thread(target=lambda: box.append(jobqueue.SlurmBackend()._cluster_class().__name__))\n"
        "t.start(); t.join()\n"
        "assert box == ['SLURMCluster'], box\n"
        "assert signal.getsignal(signal.SIGINT) is before, signal.getsignal(signal.SIGINT)\n"
        "try:\n"
        "    signal.raise_signal(signal.SIGINT)\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "interrupted", out.stderr[-2000:]
