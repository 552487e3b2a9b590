"""Local clusters: ``distributed.LocalCluster`` with worker processes on loopback.

- :mod:`.backend`: :class:`LocalBackend` (start, TLS, the dashboard off TCP, the nannies' settings);
- :mod:`.dashboard`: the scheduler's Bokeh dashboard, attached once the cluster runs;
- :mod:`.gpus`: ``--gpus``, one worker pinned to each visible device;
- :mod:`.forkserver`: worker processes forked from a server that has imported distributed;
- :mod:`.workers`: what every worker process gets (SIGINT blocked then ignored, no HTTP port, a quiet close);
- :mod:`.main_guard`: a script's cluster must start under ``if __name__ == "__main__":``.

The names below load with their module on first use: the fork server is
begun (:func:`.forkserver.start_early`) before distributed is imported.
"""

from __future__ import annotations

from ..._core.lazy import attach as _attach

#: public name -> the module of this package that defines it
_NAMES = {
    "LocalBackend": ".backend", "default_workers": ".backend", "max_local_workers": ".backend", "wants_tls": ".backend",
    "WORKER_MODULES": ".forkserver", "environ_since_forkserver": ".forkserver", "start_forkserver": ".forkserver",
    "use_forkserver": ".forkserver", "GPU_RESOURCE": ".gpus", "_cuda_cluster_class": ".gpus",
    "gpu_worker_specs": ".gpus", "select_gpus": ".gpus", "visible_gpus": ".gpus", "GUARD_FIX": ".main_guard",
    "check_main_guard": ".main_guard", "main_imported_by_workers": ".main_guard", "IgnoreSigint": ".workers",
    "ForkedNanny": ".workers", "NoWorkerHttp": ".workers", "QuietWorker": ".workers", "sigint_blocked_for_children": ".sigint",
}  # fmt: skip

__all__ = sorted(_NAMES)


__getattr__, __dir__ = _attach(__name__, _NAMES)
