"""Batch-queue clusters: SLURM (and PBS, SGE, LSF) through dask-jobqueue.

Each worker is one batch job that dask-jobqueue's ``SLURMCluster`` (``PBSCluster``,
``SGECluster``, ``LSFCluster``) writes and submits; the scheduler runs in the
notebook's process.  This module adds what a notebook user needs around it:

* options with site defaults from dask.config (``jupyter-cluster.jobqueue.*``,
  then dask-jobqueue's own ``jobqueue.<system>.*``), checked before any job is
  submitted (:func:`.options.resolve`), and ``--dry-run`` to print the job script;
* TLS by default: one certificate per cluster, in 0600 files in a 0700 folder
  the jobs read (``jupyter-cluster.jobqueue.shared-directory``, in the home
  directory by default, which batch nodes share);
* a scheduler bound to the address the batch nodes reach: the one this machine
  uses towards the SLURM controller (:func:`.options.reachable_host`), since jobs on other
  nodes must connect to it -- TLS and the 0600 credentials keep everyone else out;
* jobs that will not start are reported in one sentence with SLURM's own
  reason (``squeue %r``, or ``sbatch --test-only``'s error) within seconds
  (:func:`.slurm.pending_reason`), and cancelled;
* no job outlives the notebook: ``%cluster stop`` cancels them (dask-jobqueue),
  a watchdog process cancels them when the kernel dies (kill -9 included), the
  registry cancels a dead owner's jobs when it drops its record
  (:func:`.slurm.cancel_jobs`), and each worker exits when its scheduler is gone
  (``--death-timeout``);
* facts for the sidebar: each worker's job id, node and walltime left, and
  pending jobs with SLURM's reason (:func:`.slurm.slurm_jobs`), kept in the scheduler's
  metadata under :data:`.facts.FACTS_KEY` for the Jupyter server to read.

The modules:

- :mod:`.backend`: :class:`JobqueueBackend` (start, ``--dry-run``, the wait for the first
  worker) and one backend per batch system;
- :mod:`.systems`: the batch systems' table (dask-jobqueue's class, the submit command, ...);
- :mod:`.options`: the options checked, with site defaults, and the address the scheduler binds;
- :mod:`.credentials`: the 0700 folder the jobs read and the TLS files in it;
- :mod:`.slurm`: SLURM's queue, its never-starts reasons, the cancel of a dead owner's jobs, the watchdog;
- :mod:`.facts`: the sidebar's view of the jobs, kept in the scheduler's metadata.

The names below load with their module on first use.
"""

from __future__ import annotations

from ..._core.lazy import attach as _attach

#: public name -> the module of this package that defines it
_NAMES = {
    "INSTALL_HINT": ".backend", "SYSTEMS": ".systems", "BatchSystem": ".systems", "JobqueueBackend": ".backend", "SlurmBackend": ".backend",
    "PBSBackend": ".backend", "SGEBackend": ".backend", "LSFBackend": ".backend",
    "resolve": ".options", "reachable_host": ".options", "shared_directory": ".credentials",
    "NEVER_STARTS": ".slurm", "cancel_jobs": ".slurm", "pending_reason": ".slurm", "slurm_jobs": ".slurm",
    "start_watchdog": ".slurm", "FACTS_KEY": ".facts", "apply_facts": ".facts",
}  # fmt: skip

__all__ = sorted(_NAMES)

__getattr__, __dir__ = _attach(__name__, _NAMES)
