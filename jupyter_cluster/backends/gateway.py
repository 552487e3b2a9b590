"""dask-gateway: clusters made and kept by a Dask Gateway server (JupyterHub's usual way to Dask).

``%cluster start --backend gateway [--address URL]`` asks the gateway for a new
cluster through the ``dask-gateway`` client library and attaches to it like
any other; ``--workers N`` (``jupyter-cluster.gateway.workers``) workers are
asked for at once, ``--adapt-min``/``--adapt-max`` make it adaptive instead.
Address, authentication and TLS are the gateway's own settings, read by
dask-gateway from dask.config: ``gateway.address``, ``gateway.auth.type``
(``basic`` for a password, ``jupyterhub``, ``kerberos``) and
``gateway.auth.kwargs``.  The scheduler is reached through the gateway's
proxy (``gateway://``) with the per-cluster TLS certificate the gateway hands
to authenticated users only.

A gateway cluster has a name of the gateway's; other kernels attach to it by
that name or by this machine's registry name (:func:`attach`, used by
``%cluster connect NAME``), and ``%cluster list`` also shows the gateway's
clusters (:func:`list_clusters`).  ``%cluster stop`` shuts the gateway cluster
down when this kernel started it, and only detaches otherwise.

A gateway cluster's dashboard link is the Jupyter server's authenticated route
(``<base_url>jupyter-cluster/dashboard/<name>/status``, as for local
clusters): the server forwards it to the gateway's dashboard of that cluster,
logging into the gateway itself (:mod:`jupyter_cluster.server.gateway_dashboard`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import config
from ..errors import ClusterError
from . import Backend, RemoteClusters, StartedCluster
from .cli import ADAPT_MAX, ADAPT_MIN, WORKERS, Option

if TYPE_CHECKING:
    from ..state.registry import ClusterRecord


def _import() -> Any:
    """dask_gateway, imported (which also registers its ``gateway://`` comm and its config defaults)."""
    try:
        import dask_gateway
    except ImportError:
        raise ClusterError(
            "the gateway backend needs the dask-gateway package; install it with pip install 'jupyter-cluster[hpc]'."
        ) from None
    return dask_gateway


def configured_address() -> str | None:
    """``gateway.address`` from dask.config (without importing dask-gateway), or None."""
    import dask.config

    value = dask.config.get("gateway.address", None)
    return str(value) if value else None


def _user() -> str:
    import dask.config

    kwargs = dask.config.get("gateway.auth.kwargs", None) or {}
    return str(kwargs.get("username") or "this user")


def _error(exc: BaseException, address: str) -> ClusterError:
    """One sentence for a failed call to the gateway."""
    import aiohttp

    status = getattr(exc, "status", None)
    if status in (401, 403):
        return ClusterError(
            f"the dask-gateway at {address} refused the login of {_user()} (HTTP {status}); "
            "check the user name and password in gateway.auth.kwargs (or gateway.auth.type)."
        )
    if isinstance(exc, (aiohttp.ClientConnectionError, OSError, TimeoutError)):
        return ClusterError(
            f"no dask-gateway answered at {address}; check --address (or gateway.address) and that the gateway runs."
        )
    text = str(exc).strip().rstrip(".") or type(exc).__name__
    return ClusterError(f"the dask-gateway at {address} said: {text}.")


def _gateway(address: str | None) -> Any:
    """A ``dask_gateway.Gateway`` for ``address`` (else ``gateway.address``), with the configured auth.

    Nothing is sent yet; a basic-auth password bound for plain HTTP to another
    machine is refused here (see :func:`_check_password_transport`).
    """
    dask_gateway = _import()
    from dask_gateway.auth import get_auth
    from dask_gateway.utils import format_template

    address = address or configured_address()
    if not address:
        raise ClusterError(
            "the gateway backend needs the dask-gateway server's address; give --address URL or set gateway.address."
        )
    address = str(format_template(address))
    if "://" not in address:
        raise ClusterError(f"--address {address} is not a URL; give the gateway's address as http(s)://host:port.")
    try:
        auth = get_auth()
    except (TypeError, ValueError, ImportError) as exc:  # e.g. gateway.auth.type names no known method
        raise ClusterError(
            f"the dask-gateway client could not be set up: {str(exc).rstrip('.')}; check gateway.auth."
        ) from None
    _check_password_transport(address, auth)
    return dask_gateway.Gateway(address=address, auth=auth)


def _is_loopback(host: str) -> bool:
    """Whether ``host`` (a URL's host) names this machine's loopback interface (no name lookup)."""
    import ipaddress

    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name
        return False


def _check_password_transport(address: str, auth: Any) -> None:
    """Refuse, before any request, to send a basic-auth password over plain HTTP to another machine.

    dask-gateway sends ``gateway.auth.kwargs.password`` base64-encoded in every
    request's ``Authorization`` header; over ``http://`` anyone on the path reads
    it.  Loopback never leaves this machine, and
    ``jupyter-cluster.gateway.allow-http-password: true`` accepts the risk
    (e.g. a gateway reached through an encrypted tunnel or a trusted network).
    """
    from urllib.parse import urlsplit

    from dask_gateway.auth import BasicAuth

    if not isinstance(auth, BasicAuth) or not auth.password:
        return
    parts = urlsplit(address)
    if parts.scheme.lower() != "http" or _is_loopback(parts.hostname or ""):
        return
    if config.get("gateway.allow-http-password"):
        return
    raise ClusterError(
        f"the dask-gateway address {address} is plain http:// to another machine, so the gateway.auth password "
        "would cross the network unencrypted; use the gateway's https:// address (or a loopback one through a "
        "tunnel), or set jupyter-cluster.gateway.allow-http-password: true to send it anyway."
    )


def _proxied_link(name: str | None, own: str | None) -> str | None:
    """The dashboard link of registry cluster ``name``: the Jupyter server's route to the gateway's ``own``.

    Without a registry name (a cluster attached by the gateway's name only)
    the server has no record to forward by, so the gateway's own link stays.
    """
    if not name or not own:
        return own
    from ..state.dashboard_socket import link, parent_server_base_url

    return link(parent_server_base_url(), name)


def _close(gateway: Any) -> None:
    """Close a ``dask_gateway.Gateway`` client for good.

    Its ``__del__`` closes it again, and a second close raises ("Accessing the
    loop property while the loop is not running") from the garbage collector;
    marked asynchronous, ``__del__`` leaves it alone.
    """
    try:
        gateway.close()
    finally:
        gateway._asynchronous = True


def _call(gateway: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call the gateway, every failure as one sentence."""
    from dask_gateway import GatewayClusterError, GatewayServerError

    try:
        return fn(*args, **kwargs)
    except ClusterError:
        raise
    except (GatewayClusterError, GatewayServerError) as exc:
        raise ClusterError(
            f"the dask-gateway at {gateway.address} could not start the cluster: {str(exc).rstrip('.')}."
        ) from None
    except Exception as exc:  # aiohttp's errors, the 404/422 ValueError, timeouts
        raise _error(exc, gateway.address) from None


class GatewayCluster:
    """A gateway cluster as :class:`~jupyter_cluster.cluster.session.ClusterHandle` drives it.

    ``dask_gateway.GatewayCluster`` has ``close(shutdown=...)`` where the handle
    calls ``close(timeout=...)``; this adapter also lets ``distributed.Client``
    take it as a cluster object (``scheduler_address``, ``security``,
    ``status``, awaitable).
    """

    def __init__(self, cluster: Any):
        self.gateway_cluster = cluster

    @property
    def name(self) -> str:
        return str(self.gateway_cluster.name)

    @property
    def scheduler_address(self) -> str:
        return str(self.gateway_cluster.scheduler_address)

    @property
    def dashboard_link(self) -> str | None:
        return self.gateway_cluster.dashboard_link

    @property
    def security(self) -> Any:
        return self.gateway_cluster.security

    @property
    def status(self) -> Any:
        from distributed.core import Status

        return Status.closed if self.gateway_cluster.status == "closed" else Status.running

    def __await__(self):
        async def ready() -> GatewayCluster:
            return self

        return ready().__await__()

    def scale(self, n: int) -> None:
        gateway = self.gateway_cluster.gateway
        _call(gateway, self.gateway_cluster.scale, n)

    def adapt(self, minimum: int = 0, maximum: int | None = None, **kwargs: Any) -> None:
        gateway = self.gateway_cluster.gateway
        _call(gateway, self.gateway_cluster.adapt, minimum=minimum, maximum=maximum)

    def close(self, timeout: float | None = None) -> None:
        """Shut the gateway cluster down (its scheduler and workers) and close the gateway client."""
        try:
            self.gateway_cluster.shutdown()
        finally:
            self.gateway_cluster.gateway._asynchronous = True  # see _close

    def __repr__(self) -> str:
        return f"<GatewayCluster {self.name}>"


class GatewayBackend(Backend):
    """A cluster made by a dask-gateway server."""

    name = "gateway"
    cli_options = (
        Option("address", "the dask-gateway server's URL (else gateway.address)", None, "URL"),
        WORKERS,
        ADAPT_MIN,
        ADAPT_MAX,
    )
    api_options = ("name",)

    def attach(self, target: str, record: ClusterRecord | None) -> StartedCluster | None:
        """A gateway cluster by this machine's registry name, or by the configured gateway's name (:func:`attach`)."""
        return attach(target, record)

    def list_remote(self) -> RemoteClusters | None:
        """The configured gateway's clusters of this user (``gateway.address``), for ``%cluster list``."""
        address = configured_address()
        if address is None:
            return None
        where = f"dask-gateway at {address}"
        try:
            return RemoteClusters(where, list_clusters(address))
        except ClusterError as exc:
            return RemoteClusters(where, error=str(exc))

    def dashboard_login(self, address: str) -> dict[str, str]:
        """The gateway's login (``gateway.auth``) for its dashboards at ``address``, as the Jupyter server proxies them.

        Basic (password) and JupyterHub-token logins are sent up front; the
        password is refused for plain http:// to another machine, as a start
        refuses it.  Other methods (Kerberos answers a challenge) send none: a
        gateway whose dashboards need them answers 401.
        """
        try:
            from dask_gateway.auth import BasicAuth, JupyterHubAuth, get_auth
        except ImportError:  # no dask-gateway in the server's environment: nothing to add
            return {}
        try:
            auth = get_auth()
        except (TypeError, ValueError, ImportError) as exc:
            raise ClusterError(
                f"the gateway login (gateway.auth) could not be set up: {str(exc).rstrip('.')}."
            ) from None
        _check_password_transport(address, auth)
        if isinstance(auth, (BasicAuth, JupyterHubAuth)):
            headers, _ = auth.pre_request(None)
            return dict(headers)
        return {}

    def cleanup_orphan(self, record: ClusterRecord) -> None:
        """Shut down the gateway cluster of a dead owner (a record of a kernel that only attached stops nothing)."""
        info = record.extra.get("gateway") if isinstance(record.extra, dict) and not record.attached else None
        if isinstance(info, dict):
            stop_orphan(info)

    def start(
        self,
        address: str | None = None,
        workers: int | None = None,
        adapt_min: int | None = None,
        adapt_max: int | None = None,
        name: str | None = None,
        **options: Any,
    ) -> StartedCluster:
        self.check_options(options)
        adaptive = adapt_min is not None or adapt_max is not None
        if workers is None and not adaptive:
            workers = int(config.get("gateway.workers") or 0)
        if (workers is not None and workers < 0) or (adapt_min or 0) < 0:
            raise ClusterError("--workers and --adapt-min must be 0 or more.")
        if adapt_max is not None and adapt_max < (adapt_min or 0):
            raise ClusterError("--adapt-max must be at least --adapt-min.")
        gateway = _gateway(address)
        try:
            # a wrong password, an unreachable gateway: said before a cluster is asked for
            _call(gateway, gateway.list_clusters)
        finally:
            _close(gateway)
        from dask_gateway import GatewayCluster as Made

        cluster_options = dict(config.get("gateway.cluster-options") or {})
        # a cluster object with its own gateway client (and event loop thread), closed with it
        made = _call(gateway, Made, address=gateway.address, shutdown_on_close=True, **cluster_options)
        cluster = GatewayCluster(made)
        try:
            if adaptive:
                cluster.adapt(minimum=adapt_min or 0, maximum=adapt_max)
            elif workers:
                cluster.scale(workers)
        except BaseException:
            cluster.close()
            raise
        return StartedCluster.of(
            cluster,
            dashboard_link=_proxied_link(name, cluster.dashboard_link),
            security=cluster.security,
            extra={"gateway": {"address": gateway.address, "cluster": cluster.name}},
        )


def attach(target: str, record: Any = None) -> StartedCluster | None:
    """How to reach a gateway cluster by name, for ``%cluster connect NAME``; None if it is none.

    ``record`` is this machine's registry record called ``target`` (a gateway
    cluster another kernel started); without one, ``target`` is looked up among
    the clusters of the configured gateway (``gateway.address``), if there is one.
    The gateway hands the cluster's TLS credentials to its authenticated users.
    """
    info = (getattr(record, "extra", None) or {}).get("gateway") if record is not None else None
    if record is not None and not isinstance(info, dict):
        return None
    if info is None and configured_address() is None:
        return None
    gateway = _gateway(info["address"] if info else None)
    cluster_name = str(info["cluster"]) if info else target
    try:
        from dask_gateway.client import ClusterStatus

        try:
            report = gateway.get_cluster(cluster_name)
        except ValueError:  # the gateway's 404: no such cluster
            if info is None:
                return None
            raise ClusterError(
                f"the dask-gateway at {gateway.address} no longer has cluster {cluster_name!r}; see %cluster list."
            ) from None
        except Exception as exc:
            if info is None and getattr(exc, "status", None) not in (401, 403):
                return None  # the configured gateway is not reachable: the name is not one of its clusters
            raise _error(exc, gateway.address) from None
        if report.status != ClusterStatus.RUNNING or report.scheduler_address is None:
            raise ClusterError(
                f"gateway cluster {cluster_name!r} is {report.status.name.lower()}, not running; start a new one with "
                "%cluster start --backend gateway."
            )
        return StartedCluster(
            address=report.scheduler_address,
            dashboard_link=_proxied_link(record.name if record is not None else None, report.dashboard_link),
            security=report.security,
            extra={"gateway": {"address": gateway.address, "cluster": cluster_name}},
        )
    finally:
        _close(gateway)


def list_clusters(address: str | None = None) -> list[dict[str, Any]]:
    """The running and pending clusters of the gateway (``gateway.address``) for this user.

    Returns
    -------
    list of dict
        ``name``, ``status``, ``address`` (the scheduler's) and ``dashboard_link`` of each.
    """
    gateway = _gateway(address)
    try:
        reports = _call(gateway, gateway.list_clusters)
    finally:
        _close(gateway)
    return [
        {
            "name": r.name,
            "status": r.status.name.lower(),
            "address": r.scheduler_address or "-",
            "dashboard_link": r.dashboard_link,
        }
        for r in reports
    ]


def stop_orphan(info: dict[str, Any]) -> None:
    """Shut down the gateway cluster of a registry record whose owner died (``kill -9`` of its kernel).

    Called by the registry's clean-up of dead owners' records; runs in a daemon
    thread, as the gateway may be slow or gone, and says nothing if it fails.
    """
    import threading

    def run() -> None:
        try:
            gateway = _gateway(str(info["address"]))
            try:
                gateway.stop_cluster(str(info["cluster"]))
            finally:
                _close(gateway)
        except Exception:  # the gateway is gone or refuses: its own idle timeout ends the cluster
            pass

    threading.Thread(target=run, name="jupyter-cluster-gateway-orphan", daemon=True).start()
