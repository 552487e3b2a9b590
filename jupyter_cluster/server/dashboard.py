"""The Dask dashboard of local clusters, served through the authenticated Jupyter server.

A TLS local cluster (the default) takes its scheduler's dashboard off TCP: it
listens on a Unix socket in a private folder (:func:`jupyter_cluster.state.dashboard_socket.dashboard_on_unix_socket`),
which other users of the machine cannot open.  Browsers reach it here::

    <base_url>jupyter-cluster/dashboard/<name>/<path>   HTTP and websockets (Bokeh)

behind Jupyter's own authentication (token, cookie, XSRF for writes) and its
authorizer (resource ``"jupyter_cluster"``, as the REST routes).  The
proxy strips the prefix (the dashboard's pages use relative links, as they do
behind jupyter-server-proxy), never forwards the user's Jupyter cookies or
token, and only connects to sockets owned by this user in a folder only this
user can enter.  The kernel side (the socket, its link, its checks) is :mod:`jupyter_cluster.state.dashboard_socket`.

A dask-gateway cluster's dashboard comes through the same route: the proxy
forwards to ``<gateway address>/clusters/<cluster>/<path>``, the gateway and
cluster this machine's registry recorded for ``<name>``, with the gateway's
own login from the server's dask.config (:mod:`.gateway_dashboard`).
"""

from __future__ import annotations

import re
import socket
from collections.abc import Awaitable
from typing import Any
from urllib.parse import parse_qsl, urlencode

from ..state import registry
from ..state.dashboard_socket import ROUTE, link, socket_is_ours
from . import gateway_dashboard

__all__ = ["ROUTE", "link", "make_handler", "route", "socket_is_ours"]

#: request headers never sent on to the dashboard (Jupyter's credentials, hop-by-hop)
_DROP_REQUEST = {
    "cookie",
    "authorization",
    "host",
    "connection",
    "upgrade",
    "keep-alive",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "content-length",
    "x-xsrftoken",
    "accept-encoding",
}
#: response headers not copied back (tornado sets its own)
_DROP_RESPONSE = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "content-length",
    "content-encoding",
    "server",
    "date",
    "set-cookie",
}


def _resolver(path: str):
    from tornado.netutil import Resolver

    class UnixResolver(Resolver):
        """Every host name resolves to the dashboard's Unix socket."""

        def initialize(self, **kwargs: Any) -> None:  # Configurable hook
            pass

        async def resolve(self, host: str, port: int, family: Any = socket.AF_UNSPEC) -> list:
            return [(socket.AF_UNIX, path)]

    return UnixResolver()


def make_handler():
    """The tornado handler class (built lazily: tornado and jupyter_server are server-only imports)."""
    import tornado.web
    import tornado.websocket
    from jupyter_server.auth.decorator import authorized, ws_authenticated
    from jupyter_server.base.handlers import JupyterHandler
    from tornado.httpclient import HTTPRequest
    from tornado.simple_httpclient import SimpleAsyncHTTPClient

    class DashboardProxy(JupyterHandler, tornado.websocket.WebSocketHandler):
        """HTTP and websocket proxy to a cluster's dashboard socket; Jupyter's auth applies."""

        upstream: Any = None
        #: the resource the server's authorizer is asked about (reads: GET and the websocket; writes: POST)
        auth_resource = "jupyter_cluster"

        def _upstream(self, name: str, path: str) -> tuple[str, Any, dict[str, str]]:
            """(URL, resolver or None, login headers) of ``path`` on cluster ``name``'s dashboard."""
            record = registry.read(name) if registry.valid_name(name) else None
            extra = (record.extra or {}) if record is not None else {}
            # Jupyter's ?token= stays here (Bokeh's page copies its query onto its websocket URL)
            query = urlencode(
                [(k, v) for k, v in parse_qsl(self.request.query, keep_blank_values=True) if k != "token"]
            )
            sock = extra.get("dashboard_socket")
            if socket_is_ours(sock):
                return f"http://dashboard/{path}" + (f"?{query}" if query else ""), _resolver(sock), {}
            target = gateway_dashboard.gateway_target(extra) if record is not None else None
            if record is None or target is None:
                raise tornado.web.HTTPError(404, f"cluster {name!r} has no dashboard served through this server")
            try:
                url = gateway_dashboard.upstream_url(*target, path, query)
                return url, None, gateway_dashboard.auth_headers(target[0], record.backend)
            except gateway_dashboard.Refused as exc:
                raise tornado.web.HTTPError(400, str(exc)) from None

        def _upstream_headers(self, login: dict[str, str]) -> dict[str, str]:
            headers = {
                k: v
                for k, v in self.request.headers.get_all()
                if k.lower() not in _DROP_REQUEST and not k.lower().startswith("sec-websocket")
            }
            headers.update(login)  # the gateway's login, never the request's
            return headers

        # -- plain HTTP --------------------------------------------------------------
        async def _proxy(self, name: str, path: str) -> None:
            url, resolver, login = self._upstream(name, path)
            upstream_prefixes = gateway_dashboard.dashboard_prefixes(url) if resolver is None else ()
            client = SimpleAsyncHTTPClient(force_instance=True, resolver=resolver)
            try:
                body = self.request.body if self.request.method in ("POST", "PUT", "PATCH") else None
                response = await client.fetch(
                    HTTPRequest(
                        url,
                        method=self.request.method,
                        headers=self._upstream_headers(login),
                        body=body,
                        follow_redirects=False,
                        request_timeout=60,
                        allow_nonstandard_methods=True,
                    ),
                    raise_error=False,
                )
            finally:
                client.close()
            if response.code == 599:  # no answer from the socket
                raise tornado.web.HTTPError(502, f"the dashboard of {name!r} does not answer")
            self.clear()
            self.clear_header("Content-Type")
            self.set_status(response.code, response.reason)
            prefix = link(self.base_url, name)[: -len("status")]
            for key, value in response.headers.get_all():
                if key.lower() in _DROP_RESPONSE:
                    continue
                if key.lower() == "location":
                    # the gateway's own links to this cluster's dashboard, and the dashboard's host-relative
                    # ones (it does not know it is behind a prefix), stay under the route
                    inside = next((value[len(p) :] for p in upstream_prefixes if value.startswith(p)), None)
                    if inside is not None:
                        value = prefix + inside
                    elif value.startswith("/"):
                        value = prefix + value.lstrip("/")
                self.add_header(key, value)
            if response.body and response.code not in (204, 304):
                self.write(response.body)
            await self.finish()

        @tornado.web.authenticated
        @authorized
        async def post(self, name: str, path: str) -> None:
            await self._proxy(name, path)

        async def get(self, name: str, path: str) -> None:
            # the auth decorators answer (redirect, 403) without a coroutine to await
            result: Awaitable[None] | None
            if self.request.headers.get("Upgrade", "").lower() == "websocket":
                result = self._websocket(name, path)
            else:
                result = self._get(name, path)
            if result is not None:
                await result

        @tornado.web.authenticated
        @authorized
        async def _get(self, name: str, path: str) -> None:
            await self._proxy(name, path)

        # -- websockets (Bokeh's live updates) ---------------------------------------------
        @ws_authenticated
        @authorized  # "read" (a GET upgraded)
        async def _websocket(self, name: str, path: str) -> None:
            url, resolver, login = self._upstream(name, path)
            protocols = [
                p.strip() for p in self.request.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()
            ]
            request = HTTPRequest(
                re.sub(r"^http", "ws", url), headers=self._upstream_headers(login), connect_timeout=10
            )
            try:
                self.upstream = await tornado.websocket.websocket_connect(
                    request,
                    subprotocols=protocols or None,
                    resolver=resolver,
                    on_message_callback=self._from_upstream,
                    max_message_size=256 * 2**20,
                )
            except Exception as exc:
                raise tornado.web.HTTPError(502, f"the dashboard of {name!r} refused the websocket: {exc}") from None
            await tornado.websocket.WebSocketHandler.get(self, name, path)

        def select_subprotocol(self, subprotocols: list[str]) -> str | None:
            chosen = getattr(self.upstream, "selected_subprotocol", None)
            return chosen if chosen in subprotocols else None

        def check_origin(self, origin_to_satisfy_tornado: str = "") -> bool:
            # Jupyter's rule (its allow_origin settings), not tornado's same-host one
            return JupyterHandler.check_origin(self, origin_to_satisfy_tornado)

        def _from_upstream(self, message: Any) -> None:
            if message is None:  # the dashboard closed it
                self.close()
                return
            try:
                self.write_message(message, binary=isinstance(message, bytes))
            except tornado.websocket.WebSocketClosedError:
                pass

        def on_message(self, message: Any) -> None:
            if self.upstream is not None:
                self.upstream.write_message(message, binary=isinstance(message, bytes))

        def on_close(self) -> None:
            if self.upstream is not None:
                self.upstream.close()

    return DashboardProxy


def route(base_url: str) -> tuple[str, Any]:
    """The (pattern, handler) pair to add to the Jupyter server's application."""
    from jupyter_server.utils import url_path_join

    return url_path_join(base_url, ROUTE, r"(?P<name>[^/]+)/?(?P<path>.*)"), make_handler()
