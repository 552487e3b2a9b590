"""A batch cluster's options: site defaults from dask.config, checked before any job is submitted.

Defaults come from ``jupyter-cluster.jobqueue.*``, then dask-jobqueue's own
``jobqueue.<system>.*`` (:func:`resolve`).  The scheduler binds to the address the batch
nodes reach (:func:`reachable_host`), since jobs on other nodes must connect to it.
"""

from __future__ import annotations

import contextlib
import re
import socket
from typing import Any

from ... import config
from ...errors import ClusterError
from .slurm import controller_address

_WORD_RE = re.compile(r"[A-Za-z0-9_.,:@+=/-]+")
_WALLTIME_RE = re.compile(r"(\d+-)?\d+(:\d{1,2}){0,2}")


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
    from ...wire.models import validate_count, validate_size

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


def reachable_host(system: str) -> str:
    """The address of this machine that the batch nodes reach.

    A job on another node connects to the scheduler, so it must not listen on
    loopback.  The nodes talk to the SLURM controller, so the address this
    machine uses towards the controller is on the network they share (asking
    the kernel's routing table through an unconnected UDP socket sends
    nothing).  Elsewhere (PBS, SGE, LSF, no ``scontrol``): the address the
    host name resolves to, else the one towards the default route.
    """
    targets = [t for t in (controller_address(system),) if t]
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
