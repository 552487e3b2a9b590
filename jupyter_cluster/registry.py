"""Cluster discovery: one JSON record per known cluster on this machine.

Every cluster that a kernel, a script or the Jupyter server starts or attaches
to is written to ``<jupyter runtime dir>/jupyter-cluster/<name>.json``.  A record
names its owner process (pid and start time, so a recycled pid is not mistaken
for the owner); records whose owner is gone are reported as dead and removed by
:func:`live_records`.  The sidebar panel and ``%cluster list`` read it.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import psutil

from . import config


@dataclass
class ClusterRecord:
    """What the registry knows about one cluster."""

    name: str
    backend: str
    address: str
    dashboard_link: str | None = None
    owner_pid: int = field(default_factory=os.getpid)
    owner_started: float = 0.0
    owner_kind: str = "kernel"  # "kernel", "panel" (Jupyter server) or "process"
    started: float = field(default_factory=time.time)
    attached: bool = False  # True when the owner only connected to it
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.owner_started:
            self.owner_started = _process_start_time(self.owner_pid)

    def owner_alive(self) -> bool:
        """Whether the process that wrote this record still runs."""
        return _process_start_time(self.owner_pid) == self.owner_started != 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _process_start_time(pid: int) -> float:
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:  # killed, not yet reaped by its parent
            return 0.0
        return round(process.create_time(), 2)
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return 0.0


def registry_dir() -> str:
    """The folder that holds the records (created on demand)."""
    path = config.get("registry-dir")
    if not path:
        from jupyter_core.paths import jupyter_runtime_dir

        path = os.path.join(jupyter_runtime_dir(), "jupyter-cluster")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def _record_path(name: str) -> str:
    return os.path.join(registry_dir(), f"{name}.json")


def write(record: ClusterRecord) -> None:
    """Write (or replace) the record of ``record.name`` atomically."""
    directory = registry_dir()
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(record.to_dict(), f)
    os.replace(tmp, _record_path(record.name))


def remove(name: str) -> None:
    """Forget the record of ``name`` (no error if there is none)."""
    try:
        os.remove(_record_path(name))
    except FileNotFoundError:
        pass


def read(name: str) -> ClusterRecord | None:
    """The live record called ``name``, or None."""
    for record in live_records():
        if record.name == name:
            return record
    return None


def live_records(cleanup: bool = True) -> list[ClusterRecord]:
    """Records whose owner process still runs, oldest first.

    Parameters
    ----------
    cleanup : bool
        Delete the files of records whose owner has died.
    """
    records = []
    directory = registry_dir()
    for entry in sorted(os.listdir(directory)):
        if not entry.endswith(".json") or entry.startswith("."):
            continue
        path = os.path.join(directory, entry)
        try:
            with open(path) as f:
                data = json.load(f)
            record = ClusterRecord(**data)
        except (OSError, ValueError, TypeError):
            continue  # half-written or foreign file: not ours to judge
        if record.owner_alive():
            records.append(record)
        elif cleanup:
            remove(record.name)
    records.sort(key=lambda r: r.started)
    return records
