"""Backends: the one small interface through which clusters are made.

A backend turns options into a running (or attached) Dask cluster.  Backends
are looked up by name: the built-in ones below, plus any registered by other
packages under the ``jupyter_cluster.backends`` entry-point group.  Which one
``%cluster start`` uses comes from ``jupyter-cluster.backend`` in dask.config,
so the same notebook runs on a laptop and on Kubernetes.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, ClassVar

from ..errors import ClusterError

_BUILTIN = {
    "local": "jupyter_cluster.backends.local:LocalBackend",
    "address": "jupyter_cluster.backends.address:AddressBackend",
    "kubernetes": "jupyter_cluster.backends.kubernetes:KubernetesBackend",
    "ssh": "jupyter_cluster.backends.ssh:SSHBackend",
    "gateway": "jupyter_cluster.backends.gateway:GatewayBackend",
    "slurm": "jupyter_cluster.backends.jobqueue:SlurmBackend",
    "pbs": "jupyter_cluster.backends.jobqueue:PBSBackend",
    "sge": "jupyter_cluster.backends.jobqueue:SGEBackend",
    "lsf": "jupyter_cluster.backends.jobqueue:LSFBackend",
}


@dataclass
class StartedCluster:
    """What a backend hands back.

    Attributes
    ----------
    address : str
        Scheduler address a ``distributed.Client`` connects to.
    dashboard_link : str or None
        URL of the Dask dashboard, if there is one.
    cluster : object or None
        The ``distributed`` cluster object (with ``scale``/``adapt``/``close``),
        or None when the cluster is only attached to by address.
    security : object or None
        ``distributed.security.Security`` needed to connect (TLS clusters).
    worker_plugins : list
        ``distributed.WorkerPlugin`` instances to register once connected
        (they then also reach workers added later).
    cleanup : list
        Callables run after the cluster is stopped (e.g. deleting its
        credential files).
    extra : dict
        Backend facts for the registry record (e.g. ``dashboard_socket``).
    """

    address: str
    dashboard_link: str | None = None
    cluster: Any = None
    security: Any = None
    worker_plugins: list = field(default_factory=list)
    cleanup: list = field(default_factory=list)
    extra: dict = field(default_factory=dict)


class Backend:
    """Base class of backends.

    Subclasses set :attr:`name` and implement :meth:`start`.  ``options`` are
    the keyword arguments the backend accepts; unknown ones are refused before
    anything is started.
    """

    name: ClassVar[str] = ""
    options: ClassVar[tuple[str, ...]] = ()

    def start(self, **options: Any) -> StartedCluster:  # pragma: no cover - interface
        raise NotImplementedError

    def prepare(self, **options: Any) -> None:
        """Begin slow work :meth:`start` will need, before the caller's own waits (optional).

        Called with :meth:`start`'s options just before it (unchecked yet); may
        start a helper that later starts share (the local fork server), but
        nothing of one cluster, and raises nothing.
        """

    def check_options(self, options: dict[str, Any]) -> None:
        unknown = sorted(k for k, v in options.items() if k not in self.options and v is not None)
        if unknown:
            allowed = ", ".join("--" + o.replace("_", "-") for o in self.options) or "none"
            raise ClusterError(
                f"the {self.name} backend does not take {', '.join('--' + u.replace('_', '-') for u in unknown)}; "
                f"its options are: {allowed}."
            )


def available() -> dict[str, str]:
    """Map of backend name to ``module:Class`` for every known backend."""
    found = dict(_BUILTIN)
    for ep in entry_points(group="jupyter_cluster.backends"):
        found.setdefault(ep.name, ep.value)
    return found


def get_backend(name: str) -> Backend:
    """Instantiate the backend called ``name``."""
    spec = available().get(name)
    if spec is None:
        raise ClusterError(f"unknown backend {name!r}; choose one of: {', '.join(sorted(available()))}.")
    module_name, _, class_name = spec.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, class_name)()


async def _identity(address: str, timeout: float, security: Any) -> dict:
    import asyncio

    from distributed.core import rpc

    connection_args = security.get_connection_args("client") if security is not None else {}
    async with rpc(address, timeout=timeout, connection_args=connection_args) as scheduler:
        return await asyncio.wait_for(scheduler.identity(), timeout)


def probe_scheduler(address: str, timeout: float, security: Any) -> None:
    """Fail fast unless a Dask scheduler answers at ``address``.

    ``distributed.Client`` can wait forever on a socket that accepts but never
    speaks Dask, so ask for the scheduler's identity under a hard deadline
    first, on a private event loop (the kernel's own loop may be running).
    """
    import asyncio
    from concurrent.futures import ThreadPoolExecutor
    from concurrent.futures import TimeoutError as FuturesTimeout

    message = f"no scheduler answered at {address} within {timeout:g} s; check the address and that the scheduler runs."
    pool = ThreadPoolExecutor(1, thread_name_prefix="jupyter-cluster-probe")
    try:
        identity = pool.submit(asyncio.run, _identity(address, timeout, security)).result(timeout + 1)
    except (OSError, TimeoutError, FuturesTimeout, asyncio.TimeoutError) as exc:
        raise ClusterError(message) from exc
    except Exception as exc:  # e.g. a TLS handshake refused, a non-Dask peer
        raise ClusterError(
            f"{address} did not answer as a Dask scheduler ({type(exc).__name__}: {exc}); check the address and credentials."
        ) from exc
    finally:
        pool.shutdown(wait=False)
    if identity.get("type") != "Scheduler":
        raise ClusterError(
            f"{address} is a Dask {identity.get('type', 'server')}, not a scheduler; give the scheduler's address."
        )
