"""Dask on Kubernetes through the dask-kubernetes operator (imported lazily)."""

from __future__ import annotations

from typing import Any

from ..errors import ClusterError
from . import Backend, StartedCluster

INSTALL_HINT = "pip install 'jupyter-cluster[kubernetes]'"


def _kube_cluster_class():
    try:
        from dask_kubernetes.operator import KubeCluster
    except ImportError as exc:
        raise ClusterError(
            f"the kubernetes backend needs dask-kubernetes, which is not installed; install it with: {INSTALL_HINT}"
        ) from exc
    return KubeCluster


class KubernetesBackend(Backend):
    """Start a ``DaskCluster`` resource through ``dask_kubernetes.operator.KubeCluster``."""

    name = "kubernetes"
    options = ("name", "workers", "image", "namespace", "env")

    def start(self, **options: Any) -> StartedCluster:
        self.check_options(options)
        KubeCluster = _kube_cluster_class()
        kwargs = {k: v for k, v in options.items() if v is not None}
        if "workers" in kwargs:
            kwargs["n_workers"] = kwargs.pop("workers")
        cluster = KubeCluster(**kwargs)
        return StartedCluster(address=cluster.scheduler_address, dashboard_link=cluster.dashboard_link, cluster=cluster)
