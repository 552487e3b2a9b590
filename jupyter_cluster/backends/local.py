"""Local clusters: ``distributed.LocalCluster`` with worker processes on loopback."""

from __future__ import annotations

import os
from typing import Any

from .. import config
from ..errors import ClusterError
from . import Backend, StartedCluster


def _default_workers() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class LocalBackend(Backend):
    """One single-threaded worker process per core, bound to 127.0.0.1 by default."""

    name = "local"
    options = ("name", "workers", "threads", "memory_limit", "port", "host", "tls", "processes")

    def start(
        self,
        name: str | None = None,
        workers: int | None = None,
        threads: int | None = None,
        memory_limit: str | int | None = None,
        port: int | None = None,
        host: str | None = None,
        tls: bool | None = None,
        processes: bool | None = None,
        **options: Any,
    ) -> StartedCluster:
        self.check_options(options)
        from distributed import LocalCluster

        workers = workers if workers is not None else (config.get("local.workers") or _default_workers())
        threads = threads if threads is not None else config.get("local.threads")
        memory_limit = memory_limit if memory_limit is not None else config.get("local.memory-limit")
        host = host or config.get("local.host")
        tls = config.get("local.tls") if tls is None else tls
        if workers < 0 or threads < 1:
            raise ClusterError("--workers must be 0 or more and --threads 1 or more.")
        kwargs: dict[str, Any] = dict(
            n_workers=workers,
            threads_per_worker=threads,
            memory_limit=memory_limit,
            host=host,
            scheduler_port=port or 0,
            dashboard_address=config.get("local.dashboard-address"),
            processes=True if processes is None else processes,
            name=name,
        )
        security = None
        if tls:
            from distributed.security import Security

            security = Security.temporary()
            kwargs["security"] = security
            kwargs["protocol"] = "tls://"
        try:
            cluster = LocalCluster(**kwargs)
        except OSError as exc:
            if port and ("address already in use" in str(exc).lower() or getattr(exc, "errno", None) == 98):
                raise ClusterError(
                    f"port {port} is already taken on {host}; pick another --port or leave it out to use a free one."
                ) from None
            raise ClusterError(f"the local cluster could not start: {exc}.") from exc
        except ValueError as exc:
            raise ClusterError(f"the local cluster could not start: {exc}.") from None
        return StartedCluster(
            address=cluster.scheduler_address,
            dashboard_link=cluster.dashboard_link,
            cluster=cluster,
            security=security,
        )
