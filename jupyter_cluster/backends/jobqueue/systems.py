"""The batch systems dask-jobqueue drives, as one table: what differs between SLURM, PBS, SGE and LSF.

Each row makes one backend (:mod:`.backend`); what only SLURM offers (its queue read with
``squeue``, ``--gpus``, the watchdog) is in :mod:`.slurm`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BatchSystem:
    """One batch system's row.

    Attributes
    ----------
    name : str
        The backend's name (``--backend``), also dask-jobqueue's config name (``jobqueue.<name>.*``).
    title : str
        How the system is written in prose.
    backend : str
        The name of its backend class, which the backends' registry names.
    cluster_class : str
        dask-jobqueue's cluster class.
    submit : str
        The command that submits a job (it must be on PATH to start a cluster).
    cancel : str
        The command that cancels one.
    account_keyword : str
        The cluster class's keyword that ``--account`` fills.
    checked : str
        How the tests check it.
    """

    name: str
    title: str
    backend: str
    cluster_class: str
    submit: str
    cancel: str
    account_keyword: str
    checked: str


_SCRIPTS_ONLY = "job scripts checked in tests; no real {} runs there"

#: backend name -> its batch system
SYSTEMS: dict[str, BatchSystem] = {
    s.name: s
    for s in (
        BatchSystem("slurm", "SLURM", "SlurmBackend", "SLURMCluster", "sbatch", "scancel", "account", "tested against a real SLURM"),
        BatchSystem("pbs", "PBS", "PBSBackend", "PBSCluster", "qsub", "qdel", "account", _SCRIPTS_ONLY.format("PBS")),
        BatchSystem("sge", "SGE", "SGEBackend", "SGECluster", "qsub", "qdel", "project", _SCRIPTS_ONLY.format("SGE")),
        BatchSystem("lsf", "LSF", "LSFBackend", "LSFCluster", "bsub", "bkill", "project", _SCRIPTS_ONLY.format("LSF")),
    )
}  # fmt: skip
