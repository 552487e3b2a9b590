"""Local clusters: ``distributed.LocalCluster`` with worker processes on loopback.

- :mod:`.backend`: :class:`LocalBackend` (start, TLS, the dashboard off TCP, the nannies' settings);
- :mod:`.gpus`: ``--gpus``, one worker pinned to each visible device;
- :mod:`.forkserver`: worker processes forked from a server that has imported distributed;
- :mod:`.workers`: what every worker process gets (SIGINT blocked then ignored, no HTTP port, a quiet close);
- :mod:`.main_guard`: a script's cluster must start under ``if __name__ == "__main__":``.
"""

from __future__ import annotations

from .backend import LocalBackend, default_workers, max_local_workers, wants_tls
from .forkserver import WORKER_MODULES, environ_since_forkserver, start_forkserver, use_forkserver
from .gpus import GPU_RESOURCE, _cuda_cluster_class, gpu_worker_specs, select_gpus, visible_gpus
from .main_guard import GUARD_FIX, check_main_guard, main_imported_by_workers
from .workers import IgnoreSigint, NoWorkerHttp, QuietWorker, sigint_blocked_for_children

__all__ = [
    "GPU_RESOURCE", "GUARD_FIX", "WORKER_MODULES", "IgnoreSigint", "LocalBackend", "NoWorkerHttp", "QuietWorker",
    "_cuda_cluster_class", "check_main_guard", "default_workers", "environ_since_forkserver", "gpu_worker_specs",
    "main_imported_by_workers", "max_local_workers", "select_gpus", "sigint_blocked_for_children",
    "start_forkserver", "use_forkserver", "visible_gpus", "wants_tls",
]  # fmt: skip
