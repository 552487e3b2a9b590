"""GPUs of a local cluster: which devices, and one worker pinned to each (``--gpus``)."""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any

from ... import config
from ...errors import ClusterError

GPU_RESOURCE = "GPU"


# -- GPUs ----------------------------------------------------------------------
def _split_devices(value: Any) -> list[str]:
    if isinstance(value, (list, tuple)):
        items = [str(v) for v in value]
    else:
        items = str(value).split(",")
    return [d.strip() for d in items if d.strip()]


def visible_gpus() -> list[str]:
    """Device ids of the GPUs this process may use, in order.

    ``jupyter-cluster.local.gpu-devices`` (a list, or "0,1") wins when set — it
    lets tests and administrators name devices without probing hardware.  Then
    ``CUDA_VISIBLE_DEVICES`` (which CUDA itself honours; "" or "-1" means none),
    then ``nvidia-smi``.
    """
    configured = config.get("local.gpu-devices")
    if configured is not None:
        return _split_devices(configured)
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        devices = _split_devices(env)
        return [] if devices in ([], ["-1"]) else devices
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run(
            [smi, "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return _split_devices(out.stdout.replace("\n", ",")) if out.returncode == 0 else []


def select_gpus(gpus: Any) -> list[str]:
    """The devices ``--gpus`` asks for: all visible ones (True/"all") or a listed subset."""
    visible = visible_gpus()
    if not visible:
        raise ClusterError(
            "this machine has no visible GPUs (nvidia-smi found none and CUDA_VISIBLE_DEVICES names none), "
            "so --gpus cannot start GPU workers; leave out --gpus to use CPU workers."
        )
    if gpus is True or str(gpus).lower() in ("all", "true"):
        return visible
    wanted = _split_devices(gpus)
    unknown = [d for d in wanted if d not in visible]
    if unknown or not wanted or len(set(wanted)) != len(wanted):
        raise ClusterError(
            f"--gpus {gpus} does not name distinct visible GPUs; the visible ones are {', '.join(visible)}."
        )
    return wanted


def gpu_worker_specs(devices: list[str], threads: int, memory_limit: Any, host: str, security: Any) -> dict[str, dict]:
    """``SpecCluster`` worker specs: one nanny per device, pinned and advertising ``GPU=1``.

    The pin is an environment variable of the worker process, so it is in
    place before anything in the worker can initialise CUDA.
    """
    from distributed import Nanny

    specs = {}
    for device in devices:
        options: dict[str, Any] = {
            "nthreads": threads,
            "memory_limit": memory_limit,
            "host": host,
            "env": {"CUDA_VISIBLE_DEVICES": device},
            "resources": {GPU_RESOURCE: 1},
            "name": f"gpu-{device}",
        }
        if security is not None:
            options["security"] = security
        specs[f"gpu-{device}"] = {"cls": Nanny, "options": options}
    return specs


def _cuda_cluster_class():
    try:
        from dask_cuda import LocalCUDACluster
    except ImportError:
        return None
    return LocalCUDACluster
