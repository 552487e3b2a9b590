"""The dashboard of a dask-gateway cluster, reached through the authenticated Jupyter server.

A dask-gateway serves each cluster's dashboard on its own proxy under
``<gateway address>/clusters/<cluster>/``.  The Jupyter server forwards
browsers there (:mod:`jupyter_cluster.server.dashboard`, the same route as a
local cluster's socket: ``<base_url>jupyter-cluster/dashboard/<name>/<path>``)
behind Jupyter's authentication, and adds the gateway's own login (the
backend's :meth:`~jupyter_cluster.backends.Backend.dashboard_login`: ``gateway.auth``
in dask.config, read in the server's process, as the user who runs the server;
never taken from the request).

No open proxy: the only upstream is the gateway address and cluster name this
machine's registry recorded for the registered cluster ``<name>``, and ``<path>``
must stay under that cluster's dashboard prefix (no ``..``, no scheme, no host).
Import-light: no tornado, no jupyter_server.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote, urlsplit

#: a dask-gateway cluster name (the gateway makes them as ``<namespace>.<uuid hex>``)
_CLUSTER = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,200}")


class Refused(ValueError):
    """A path or record the proxy will not forward; its text says why in one sentence."""


def gateway_target(extra: Any) -> tuple[str, str] | None:
    """The (gateway address, cluster name) a registry record's ``extra`` names, or None if none or malformed.

    Parameters
    ----------
    extra : dict or None
        The record's backend facts; a gateway cluster's hold ``{"gateway": {"address": ..., "cluster": ...}}``.
    """
    info = extra.get("gateway") if isinstance(extra, dict) else None
    if not isinstance(info, dict):
        return None
    address, cluster = info.get("address"), info.get("cluster")
    if not isinstance(address, str) or not isinstance(cluster, str) or not _CLUSTER.fullmatch(cluster):
        return None
    parts = urlsplit(address)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        return None
    return address.rstrip("/"), cluster


def upstream_url(address: str, cluster: str, path: str, query: str = "") -> str:
    """The URL of ``path`` under gateway cluster ``cluster``'s dashboard at ``address``.

    ``path`` is the decoded rest of the request's path.  Raises :class:`Refused`
    for one that would leave the cluster's dashboard (``..`` or ``.``
    segments, a backslash, a scheme or host, control characters).
    """
    segments = path.split("/")
    if (
        any(s in ("..", ".") for s in segments)
        or "\\" in path
        or "://" in path
        or path.startswith("/")
        or any(ord(c) < 0x20 or ord(c) == 0x7F for c in path)
    ):
        raise Refused(f"the path {path!r} is not under the cluster's dashboard; only its own pages are forwarded.")
    url = f"{address}/clusters/{quote(cluster, safe='')}/{quote(path, safe='/')}"
    return url + (f"?{query}" if query else "")


def dashboard_prefixes(url: str) -> tuple[str, ...]:
    """The absolute and host-relative prefixes of the cluster dashboard that ``url`` (from :func:`upstream_url`) is in.

    A redirect to one of these is a redirect within the dashboard, which the
    proxy rewrites to its own route.
    """
    parts = urlsplit(url)
    segments = parts.path.split("/")  # "", "clusters", "<cluster>", ...
    path = "/".join(segments[:3]) + "/"
    return (f"{parts.scheme}://{parts.netloc}{path}", path)


def auth_headers(address: str, backend: str = "gateway") -> dict[str, str]:
    """The login headers for a request to the dashboards at ``address``: the ``backend``'s own (``gateway.auth``).

    The backend decides (:meth:`~jupyter_cluster.backends.Backend.dashboard_login`):
    a dask-gateway sends its basic (password) or JupyterHub-token login up
    front, and refuses the password for plain http:// to another machine, as
    the kernel side refuses it.  Raises :class:`Refused` with its sentence.
    """
    from ..backends import dashboard_login
    from ..errors import ClusterError

    try:
        return dashboard_login(backend, address)
    except ClusterError as exc:
        raise Refused(str(exc)) from None
