"""Kept clusters: started in a host process that is not the kernel, attached from any kernel by name.

``%cluster start --keep`` and ``jupyter_cluster.start(keep=True)`` spawn
``python -m jupyter_cluster.detached.host`` in a session of its own, read the
one line it announces, and attach this kernel to the cluster by name
(:func:`jupyter_cluster.cluster.session.connect`).  The kernel's death or
restart then only drops its attachment; the cluster, its detached jobs and
their results stay, until it is stopped or idles out (``idle_timeout``).
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from typing import Any

from .. import config
from ..cluster import session
from ..errors import ClusterError
from ..state import job_store, registry

#: how long the host may take to start its cluster and announce it (seconds), beyond connect-timeout
START_GRACE = 120.0


def is_kept(name: str) -> bool:
    """Whether the registered cluster ``name`` is a kept one (owned by a host process)."""
    record = registry.read(name)
    return bool(record is not None and not record.attached and (record.extra or {}).get("kept"))


def idle_seconds(idle_timeout: Any = None) -> float:
    """``--idle-timeout`` (or ``detached.idle-timeout`` when None) in seconds: "20s", "30min", "1h", 90, 0.

    Raises
    ------
    ClusterError
        For a value that is not a duration, or a negative one.
    """
    from dask.utils import parse_timedelta

    value = config.get("detached.idle-timeout") if idle_timeout is None else idle_timeout
    text = str(value).strip()
    # "30min" is how people write it; Dask's parser knows "m" and "minutes" only
    text = re.sub(r"(?<=[0-9 ])mins?$", "minutes", text)
    try:
        seconds = float(parse_timedelta(text, default="s"))
    except (ValueError, TypeError, KeyError):
        raise ClusterError(f"--idle-timeout takes a duration such as 20s, 30min or 0 (never), not {value!r}.") from None
    if seconds < 0:
        raise ClusterError("--idle-timeout must be 0 (never) or more.")
    return seconds


def start(
    name: str | None = None,
    backend: str | None = None,
    idle_timeout: Any = None,
    **options: Any,
) -> session.ClusterHandle:
    """Start a kept cluster in a host process and attach this process to it; returns the attached handle.

    Parameters
    ----------
    name : str, optional
        Unique name; defaults to ``<backend>-<n>``.
    backend : str, optional
        As for :func:`jupyter_cluster.start`.
    idle_timeout : str or float, optional
        The cluster stops itself after this long with no running detached
        job and no attached kernel ("20s", "30min", seconds; 0 = never).
        Default: ``jupyter-cluster.detached.idle-timeout``.
    **options
        Backend options (``workers``, ``threads``, ...), as for :func:`jupyter_cluster.start`.
    """
    seconds = idle_seconds(idle_timeout)
    if name is not None and registry.read(name) is not None:
        raise ClusterError(
            f"a cluster named {name!r} already exists; choose another --name or attach with %cluster connect {name}."
        )
    options = {k: v for k, v in options.items() if v is not None}
    if options.pop("wait", True) is False:
        raise ClusterError("--no-wait and --keep do not go together: a kept cluster starts before it is attached.")
    try:
        encoded = json.dumps(options)
    except TypeError as exc:
        raise ClusterError(f"the start options cannot be given to a kept cluster's host: {exc}.") from None
    cmd = [sys.executable, "-m", "jupyter_cluster.detached.host", "--options", encoded]
    if name is not None:
        cmd += ["--name", name]
    if backend is not None:
        cmd += ["--backend", backend]
    cmd += ["--idle-timeout", f"{seconds:g}"]
    log = os.path.join(job_store.store_dir(), f".host-{name or 'cluster'}-{os.getpid()}-{time.time_ns()}.log")
    cmd += ["--log", log]
    # the host serves every kernel: it is not this kernel's notebook (each job says whose it is)
    env = {k: v for k, v in os.environ.items() if k != "JPY_SESSION_NAME"}
    env.update(_inherited_config())
    # a session of its own: a kernel's shutdown signals its process group, and the cluster must outlive it
    with open(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as err:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, start_new_session=True, env=env
        )
    announced = _read_announcement(proc, config.timeout_seconds("connect-timeout") + START_GRACE)
    if not announced.get("ok"):
        raise ClusterError(
            announced.get("error") or f"the kept cluster's host did not start its cluster; its log is {log}."
        )
    try:
        return session.connect(announced["name"])
    except BaseException:
        # not attached, so nobody would stop it (with --idle-timeout 0 it would never stop itself)
        proc.terminate()
        raise


def _inherited_config() -> dict[str, str]:
    """This kernel's Dask settings for the host (``dask.config.set`` in a cell is not in its environment).

    Without them a kept SSH cluster's host logs in without the kernel's
    ``jupyter-cluster.ssh`` keys and known hosts, a SLURM one misses its
    queue, and so on.  Sections that do not serialize (a callable set
    in-process) are left out.
    """
    import dask.config

    inherited: dict[str, Any] = {}
    for section in ("jupyter-cluster", "distributed", "jobqueue", "gateway", "kubernetes"):
        value = dask.config.get(section, None)
        if value is None:
            continue
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            continue
        inherited[section] = value
    return {"DASK_INTERNAL_INHERIT_CONFIG": dask.config.serialize(inherited)} if inherited else {}


def _read_announcement(proc: subprocess.Popen, timeout: float) -> dict[str, Any]:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    line = b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0:
            proc.kill()
            raise ClusterError(f"the kept cluster's host did not announce its cluster within {timeout:g} s.")
        ready, _, _ = select.select([proc.stdout], [], [], min(left, 0.5))
        if ready:
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                break
            line += chunk
        elif proc.poll() is not None:
            break
    proc.stdout.close()
    try:
        return json.loads(line.decode() or "{}")
    except ValueError:
        return {"ok": False, "error": f"the kept cluster's host said something unexpected: {line[:200]!r}"}


def stop(name: str, timeout: float = 60.0) -> str:
    """Stop the kept cluster ``name``: this process lets go of it, and its host shuts it down.

    The host is asked with SIGTERM (it is a process of this user on this
    machine, proven by its command line), not over the scheduler: a client
    whose scheduler closes under it logs reconnect errors.
    """
    record = registry.read(name)
    if record is None or not (record.extra or {}).get("kept"):
        raise ClusterError(f"no kept cluster named {name!r} is running; see %cluster list.")
    held = {h.name: h for h in session.handles()}
    if name in held:
        held[name].close()  # only our attachment goes: the host owns the cluster
    if not _is_host(record):
        raise ClusterError(f"the owner of {name!r} (pid {record.owner_pid}) is not its host process; stop it there.")
    os.kill(record.owner_pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while registry.read(name) is not None and record.owner_alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    if registry.read(name) is not None and record.owner_alive():
        raise ClusterError(
            f"the host of kept cluster {name!r} (pid {record.owner_pid}) did not stop within {timeout:g} s."
        )
    return name


def _is_host(record: registry.ClusterRecord) -> bool:
    """Whether the record's owner is a kept cluster's host process of this user (never signal another)."""
    import psutil

    if not record.owner_alive():
        return False
    try:
        process = psutil.Process(record.owner_pid)
        cmdline = process.cmdline()
        hosts = ("jupyter_cluster.detached.host", "jupyter_cluster.server.host")  # a kernel's kept cluster, the panel's
        return process.uids().real == os.getuid() and any(h in cmdline for h in hosts)
    except (psutil.Error, OSError):
        return False
