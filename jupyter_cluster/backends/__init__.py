"""Backends: the one small interface through which clusters are made.

A backend turns options into a running (or attached) Dask cluster.  Backends
are found by name under the ``jupyter_cluster.backends`` entry-point group,
where this package registers its own (``pyproject.toml``) and any other package
may register more, as ipyparallel finds its launchers.  Which one ``%cluster
start`` uses comes from ``jupyter-cluster.backend`` in dask.config, so the same
notebook runs on a laptop and on Kubernetes.

A backend owns everything that is particular to it: the options it takes
(:attr:`Backend.cli_options`, from which ``%cluster start``'s parser is built),
how another kernel attaches to one of its clusters by name (:meth:`Backend.attach`),
what the sidebar and the widget show of it (:meth:`Backend.describe`), the
clusters a remote service holds (:meth:`Backend.list_remote`), what is done when
its owner died (:meth:`Backend.cleanup_orphan`), the size a form shows first
(:meth:`Backend.default_workers`) and the login the Jupyter server's dashboard
proxy sends (:meth:`Backend.dashboard_login`).  Nothing outside this package
imports a particular backend.
"""

from __future__ import annotations

import functools
import importlib
import logging
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import ClusterError
from ..state import orphans
from .cli import MergedOption, Option, merged

if TYPE_CHECKING:
    from ..state.registry import ClusterRecord

logger = logging.getLogger(__name__)

#: the entry-point group backends are registered under (``[project.entry-points."jupyter_cluster.backends"]``)
GROUP = "jupyter_cluster.backends"

#: this package's own entry points, as ``pyproject.toml`` registers them, in the order they are listed: used
#: where the installed metadata has none of them (a development install made before the group existed); a
#: test keeps the two equal
_SHIPPED = {
    "local": "jupyter_cluster.backends.local:LocalBackend",
    "address": "jupyter_cluster.backends.address:AddressBackend",
    "ssh": "jupyter_cluster.backends.ssh:SSHBackend",
    "kubernetes": "jupyter_cluster.backends.kubernetes:KubernetesBackend",
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

    @classmethod
    def of(cls, cluster: Any, **fields: Any) -> StartedCluster:
        """What a backend hands back for a ``distributed`` cluster object: its address and dashboard, and ``fields``."""
        fields.setdefault("dashboard_link", getattr(cluster, "dashboard_link", None))
        return cls(address=cluster.scheduler_address, cluster=cluster, **fields)


@dataclass
class RemoteClusters:
    """The clusters a remote service holds for this user (:meth:`Backend.list_remote`), for ``%cluster list``.

    Attributes
    ----------
    where : str
        The service, as a heading (``dask-gateway at https://...``).
    clusters : list of dict
        ``name``, ``status`` and ``address`` of each.
    error : str or None
        Why the service could not be asked (one sentence), instead of clusters.
    """

    where: str
    clusters: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None


class Backend:
    """Base class of backends.

    Subclasses set :attr:`name`, declare their options and implement
    :meth:`start`; the other hooks are optional.  Unknown options are refused
    before anything is started (:meth:`check_options`).
    """

    name: ClassVar[str] = ""
    #: the options ``%cluster start`` parses for this backend (and ``jupyter_cluster.start`` accepts)
    cli_options: ClassVar[tuple[Option, ...]] = ()
    #: keyword options only a call passes (``processes=False``, ``security=...``), never the command line
    api_options: ClassVar[tuple[str, ...]] = ()
    #: every keyword :meth:`start` takes: the two above (set for each subclass)
    options: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "options" not in cls.__dict__:
            cls.options = tuple(o.name for o in cls.cli_options) + tuple(cls.api_options)

    def start(self, **options: Any) -> StartedCluster:  # pragma: no cover - interface
        raise NotImplementedError

    def prepare(self, **options: Any) -> None:
        """Begin slow work :meth:`start` will need, before the caller's own waits (optional).

        Called with :meth:`start`'s options just before it (unchecked yet); may
        start a helper that later starts share (the local fork server), but
        nothing of one cluster, and raises nothing.
        """

    def attach(self, target: str, record: ClusterRecord | None) -> StartedCluster | None:
        """How to reach a cluster of this backend by name (``%cluster connect NAME``), or None.

        ``record`` is this machine's registry record called ``target`` (None when
        there is none: a backend may then look ``target`` up in a service of its
        own).  None means the record's scheduler address is reached directly,
        which is what most backends want.
        """
        return None

    async def describe(self, model: dict[str, Any], extra: dict[str, Any], client: Any) -> None:
        """Add this backend's view of a started cluster to ``model`` (the sidebar's detail, the widget), in place.

        ``extra`` is the backend's facts from the cluster's registry record
        (:attr:`StartedCluster.extra`), ``client`` an asynchronous use of the
        cluster's ``distributed.Client``.  Called by the Jupyter server and the
        widget; must not raise, and must give up within about 10 s.
        """

    def list_remote(self) -> RemoteClusters | None:
        """The clusters a remote service of this backend holds for this user, or None if none is configured."""
        return None

    def cleanup_orphan(self, record: ClusterRecord) -> None:
        """Stop what a cluster whose owner process died left running (cancel batch jobs, say); quickly.

        Called by the registry when it drops the record of a dead owner
        (:mod:`jupyter_cluster.state.orphans`).  Most backends have nothing to
        do: local workers die with their owner, an attached cluster is not ours.
        """

    def default_workers(self) -> int | None:
        """The workers a start without ``--workers`` begins with, as a form shows it first; None if not known here."""
        return None

    def dashboard_login(self, address: str) -> dict[str, str]:
        """The login headers the Jupyter server's dashboard proxy sends to this backend's dashboard at ``address``.

        Read in the server's process (its dask.config, as the user who runs the
        server), never from a request.  Raises :class:`~jupyter_cluster.errors.ClusterError`
        (one sentence) where no login may be sent there.  Most backends' dashboards need none.
        """
        return {}

    def check_options(self, options: dict[str, Any]) -> None:
        unknown = sorted(k for k, v in options.items() if k not in self.options and v is not None)
        if unknown:
            allowed = ", ".join("--" + o.replace("_", "-") for o in self.options) or "none"
            raise ClusterError(
                f"the {self.name} backend does not take {', '.join('--' + u.replace('_', '-') for u in unknown)}; "
                f"its options are: {allowed}."
            )


def available() -> dict[str, str]:
    """Map of backend name to ``module:Class`` for every registered backend, this package's first.

    Read once per ``sys.path`` (reading the installed metadata takes tens of
    milliseconds): a backend installed into a running process is found once a
    folder is added to the path, else in the next process.
    """
    return dict(_registered(tuple(sys.path)))


@functools.lru_cache(maxsize=4)
def _registered(path: tuple[str, ...]) -> dict[str, str]:
    found = {ep.name: ep.value for ep in entry_points(group=GROUP)}
    if not any(value.startswith("jupyter_cluster.") for value in found.values()):
        found.update(_SHIPPED)  # metadata older than the group: this package's own, as pyproject has them
    # the installed metadata lists entry points by name; the built-ins keep pyproject's order (local first)
    order = {name: i for i, name in enumerate(_SHIPPED)}
    own = [k for k, v in found.items() if v.startswith("jupyter_cluster.")]
    shipped = {k: found[k] for k in sorted(own, key=lambda k: (order.get(k, len(order)), k))}
    # another package's backend cannot replace a built-in one under its name
    return shipped | {k: found[k] for k in sorted(found) if k not in shipped}


def backend_class(name: str) -> type[Backend]:
    """The class of the backend called ``name`` (its module imported)."""
    # A built-in name needs no look at the installed metadata (tens of ms on a script's first start):
    # no other package's backend may take it.
    spec = _SHIPPED.get(name) or available().get(name)
    if spec is None:
        raise ClusterError(f"unknown backend {name!r}; choose one of: {', '.join(sorted(available()))}.")
    module_name, _, class_name = spec.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise ClusterError(f"the {name} backend ({spec}) could not be loaded: {exc}.") from exc
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise ClusterError(f"the {name} backend ({spec}) is not a jupyter_cluster.backends.Backend subclass.")
    return cls


def get_backend(name: str) -> Backend:
    """Instantiate the backend called ``name``."""
    return backend_class(name)()


def backend_classes() -> dict[str, type[Backend]]:
    """Every registered backend that loads here; one that does not is left out (and logged)."""
    out = {}
    for name in available():
        try:
            out[name] = backend_class(name)
        except ClusterError as exc:
            logger.warning("%s", exc)
    return out


def start_options() -> list[MergedOption]:
    """The options of every backend as ``%cluster start``'s flags (see :func:`.cli.merged`)."""
    return merged((name, cls.cli_options) for name, cls in backend_classes().items())


def describer(backend: str) -> Callable[[dict[str, Any], dict[str, Any], Any], Awaitable[None]] | None:
    """The :meth:`Backend.describe` of the backend called ``backend``, or None where it adds nothing (or is not known here).

    The widget and the Jupyter server call it to add the backend's view to a
    cluster's model; None spares them a call on the cluster's event loop.
    """
    try:
        cls = backend_class(backend)
    except ClusterError:
        return None
    return None if cls.describe is Backend.describe else cls().describe


def dashboard_login(backend: str, address: str) -> dict[str, str]:
    """The :meth:`Backend.dashboard_login` of the backend called ``backend`` (none where it is not known here)."""
    try:
        impl = get_backend(backend)
    except ClusterError:
        return {}
    return impl.dashboard_login(address)


def cleanup_orphan(record: ClusterRecord) -> None:
    """Ask the backend a dead owner's record names to clean up after it (the registry's hook, below)."""
    try:
        impl = get_backend(str(record.backend))
    except ClusterError:  # a backend of a package not installed here: nothing we can do
        return
    impl.cleanup_orphan(record)


# the registry (a lower layer) drops a dead owner's record; what its backend does then is asked here
orphans.install(cleanup_orphan)


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
