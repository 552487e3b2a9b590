"""Thin HTTP and websocket handlers under ``<base_url>/jupyter-cluster/api/``.

Every route needs Jupyter authentication; writes (POST, DELETE) go through
Jupyter's XSRF check.  Each request is also put to the server's authorizer
(``jupyter_server.auth.Authorizer``) as an action on the resource
:data:`AUTH_RESOURCE`: ``"read"`` for GET and the events socket, ``"write"``
for POST and DELETE (start, scale, adapt, stop), so that a deployment's
authorizer (JupyterHub's read-only access, say) can let a user watch the
clusters without changing them.  Handlers validate and translate; the work
is done by :class:`~jupyter_cluster.server.manager.ClusterManager`.  Errors
are JSON ``{"message": "..."}`` with a 4xx status.

Routes::

    GET    clusters                         live clusters
    POST   clusters                         start one {name?, workers?, threads?, memory_limit?, backend?}
    GET    clusters/NAME                    details and workers
    DELETE clusters/NAME                    stop it
    POST   clusters/NAME/scale              {workers: N}
    POST   clusters/NAME/adapt              {minimum: A, maximum: B}
    GET    clusters/NAME/metrics            its metric topics
    GET    clusters/NAME/metrics/TOPIC      its points (shared metrics model, downsampled)
    GET    jobs                             running and recent maps (?cluster=NAME&notebook=PATH&kernel=ID)
    GET    runs                             runs, newest first (?notebook=PATH&cluster=NAME&kernel=ID)
    GET    runs/RUN                         one run with its items and its sweep table rows
    GET    runs/RUN/curves                  its items' curves, per metric
    GET    config                           defaults the panel offers
    GET    detached                         detached jobs and kept clusters (see server.detached)
    POST   detached/NAME/cancel             cancel a detached job
    WS     events                           pushed updates (see EventsSocket)
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any, NoReturn
from urllib.parse import unquote

import tornado.web
import tornado.websocket
from jupyter_server.auth.decorator import authorized, ws_authenticated
from jupyter_server.base.handlers import APIHandler, JupyterHandler
from jupyter_server.utils import url_path_join

from .. import config
from ..backends import available
from ..errors import ClusterError
from ..wire import envelopes as env
from ..wire import requests as req
from ..wire.models import kernel_id_or_none
from . import dashboard, detached
from .identity import check_shown
from .manager import ClusterManager, NotFound, validate_name
from .workers import WorkerFeed

API = "jupyter-cluster/api"
#: what the routes are to the server's authorizer (its ``is_authorized(handler, user, action, resource)``)
AUTH_RESOURCE = "jupyter_cluster"
NAME = r"(?P<name>[^/]+)"
SETTINGS_KEY = "jupyter_cluster_manager"
#: seconds between the events socket's looks at the watched cluster's workers
WORKERS_POLL = 1.0


class Refusal(tornado.web.HTTPError):
    """A 4xx answer whose one-sentence message goes in the JSON body, not the status line."""

    def __init__(self, status: int, message: str):
        super().__init__(status)
        self.message = message


class BaseHandler(APIHandler):
    """JSON in, JSON out, one-sentence errors."""

    auth_resource = AUTH_RESOURCE
    #: the query arguments :meth:`fields` checked
    checked_args: dict[str, Any]

    @property
    def manager(self) -> ClusterManager:
        return self.settings[SETTINGS_KEY]

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        message = getattr(exc, "message", None) or getattr(exc, "log_message", None) or self._reason
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"message": message}))

    def fail(self, status: int, message: str) -> NoReturn:
        raise Refusal(status, message)

    def body(self) -> dict[str, Any]:
        """The request's JSON object (``{}`` when it has no body)."""
        if not self.request.body:
            return {}
        try:
            data = json.loads(self.request.body)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
            self.fail(400, "the request body is not valid JSON.")
        if not isinstance(data, dict):
            self.fail(400, "the request body must be a JSON object.")
        return data

    def fields(self, takes: req.Fields, args: req.Fields = req.NOTHING) -> dict[str, Any]:
        """The body's fields as ``takes`` checks them; a field it does not take, or of the wrong type, is a 400.

        The query arguments are checked first, as ``args`` (none by default); :attr:`checked_args` holds them.
        """
        self.checked_args = self.query(args)
        try:
            return takes.check(self.body())
        except ClusterError as exc:
            self.fail(400, str(exc))

    def query(self, takes: req.Fields) -> dict[str, Any]:
        """The query arguments as ``takes`` checks them (Jupyter's ``token`` and ``_xsrf`` aside); others are a 400."""
        args = {}
        for k in self.request.query_arguments:
            v = self.get_query_argument(k)
            if k not in req.JUPYTER_ARGUMENTS and not req.cache_buster(k, v):  # (JupyterLab's ?<ms> is none of ours)
                args[k] = v
        try:
            return takes.check(args, kind="query argument")
        except ClusterError as exc:
            self.fail(400, str(exc))

    def name_arg(self, name: str) -> str:
        name = unquote(name)
        try:
            return validate_name(name)
        except ClusterError as exc:
            self.fail(400, str(exc))

    async def run(self, coro: Any) -> Any:
        """Await a manager call, turning its errors into JSON responses."""
        try:
            return await coro
        except NotFound as exc:
            self.fail(404, str(exc))
        except ClusterError as exc:
            self.fail(400, str(exc))

    def read(self, query: Callable[..., Any], *args: Any) -> Any:
        """A manager query's answer; a cluster or topic it does not know is a 404."""
        try:
            return query(*args)
        except NotFound as exc:
            self.fail(404, str(exc))

    def reply(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data))


#: what each route takes (a route not named here takes nothing: ``req.NOTHING``)
NEW_CLUSTER = req.Fields(
    "a new cluster",
    {
        "name": lambda v: None if v == "" else req.name(v),
        "workers": req.count("workers"),
        "threads": req.count("threads", minimum=1),
        "memory_limit": req.size("memory_limit"),
        "backend": lambda v: None if v == "" else req.text("backend", 100)(v),
    },
)
SCALE = req.Fields(
    "scale",
    {"workers": req.count("workers")},
    required=("workers",),
    hint='give the number of workers as {"workers": N}',
)
ADAPT = req.Fields(
    "adapt",
    {"minimum": req.count("minimum"), "maximum": req.count("maximum")},
    one_of=True,
    hint='give the bounds as {"minimum": A, "maximum": B} (either may be left out)',
)
FILTERS = req.Fields(
    "this list",
    {"cluster": req.name, "notebook": req.text("notebook"), "kernel": lambda v: _kernel(v)},
)


#: the events socket's messages from the panel: the fields each takes (their values are checked where read)
#: (wire/envelopes.py's WatchMessage and IntervalMessage: tests/wire/test_envelopes.py checks they agree)
SOCKET_MESSAGES = {
    "watch": req.Fields("a watch message", {"type": str, "cluster": lambda v: v, "topics": lambda v: v}),
    "interval": req.Fields("an interval message", {"type": str, "ms": lambda v: v}),
}


def _kernel(value: Any) -> str:
    kernel = kernel_id_or_none(value)
    if kernel is None:
        raise ClusterError(f"kernel must be a kernel id, not {str(value)[:40]!r}.")
    return kernel


class ClustersHandler(BaseHandler):
    @tornado.web.authenticated
    @authorized
    async def get(self) -> None:
        self.fields(req.NOTHING)
        self.reply({"clusters": self.manager.clusters()})

    @tornado.web.authenticated
    @authorized
    async def post(self) -> None:
        data = self.fields(NEW_CLUSTER)
        summary = await self.run(
            self.manager.start_cluster(
                name=data.get("name"),
                workers=data.get("workers"),
                threads=data.get("threads"),
                memory_limit=data.get("memory_limit"),
                backend=data.get("backend") or None,
            )
        )
        self.reply({"cluster": summary}, status=201)


class ClusterHandler(BaseHandler):
    @tornado.web.authenticated
    @authorized
    async def get(self, name: str) -> None:
        self.fields(req.NOTHING)
        self.reply(await self.run(self.manager.cluster(self.name_arg(name))))

    @tornado.web.authenticated
    @authorized
    async def delete(self, name: str) -> None:
        self.fields(req.Fields("stopping a cluster"), req.Fields("stopping a cluster", {"id": req.text("id", 200)}))
        name = self.name_arg(name)
        shown = self.checked_args.get("id")
        if shown is not None:  # the panel's Stop acts on the cluster it showed, never on a later one of that name
            try:
                check_shown(self.manager, name, shown)
            except ClusterError as exc:
                self.fail(409, str(exc))
        await self.run(self.manager.stop(name))
        self.reply({"stopped": name})


class ScaleHandler(BaseHandler):
    @tornado.web.authenticated
    @authorized
    async def post(self, name: str) -> None:
        name = self.name_arg(name)
        data = self.fields(SCALE)
        await self.run(self.manager.scale(name, data["workers"]))
        self.reply({"cluster": name, "workers": data["workers"]})


class AdaptHandler(BaseHandler):
    @tornado.web.authenticated
    @authorized
    async def post(self, name: str) -> None:
        name = self.name_arg(name)
        data = self.fields(ADAPT)
        minimum, maximum = data.get("minimum", 0), data.get("maximum")
        await self.run(self.manager.adapt(name, minimum, maximum))
        self.reply({"cluster": name, "minimum": minimum, "maximum": maximum})


class TopicsHandler(BaseHandler):
    @tornado.web.authenticated
    @authorized
    async def get(self, name: str) -> None:
        self.fields(req.NOTHING)
        name = self.name_arg(name)
        self.reply({"cluster": name, "topics": self.read(self.manager.topics, name)})


class MetricsHandler(BaseHandler):
    @tornado.web.authenticated
    @authorized
    async def get(self, name: str, topic: str) -> None:
        self.fields(req.NOTHING)
        name = self.name_arg(name)
        self.reply(self.read(self.manager.metrics, name, unquote(topic)))


class JobsHandler(BaseHandler):
    @tornado.web.authenticated
    @authorized
    async def get(self) -> None:
        cluster, notebook, kernel = _run_filters(self)
        self.reply(self.read(self.manager.jobs, cluster, notebook, kernel))


def _run_filters(handler: BaseHandler) -> tuple[str | None, str | None, str | None]:
    """The ``cluster``, ``notebook`` and ``kernel`` query arguments, checked (a bad or unknown one is a 400)."""
    handler.fields(req.NOTHING, args=FILTERS)
    args = handler.checked_args
    return args.get("cluster"), args.get("notebook"), args.get("kernel")


class RunsHandler(BaseHandler):
    @tornado.web.authenticated
    @authorized
    async def get(self) -> None:
        cluster, notebook, kernel = _run_filters(self)
        self.reply({"runs": self.read(self.manager.runs, notebook, cluster, kernel)})


class RunHandler(BaseHandler):
    @tornado.web.authenticated
    @authorized
    async def get(self, run: str) -> None:
        self.fields(req.NOTHING)
        self.reply(self.read(self.manager.run, run))


class RunCurvesHandler(BaseHandler):
    @tornado.web.authenticated
    @authorized
    async def get(self, run: str) -> None:
        self.fields(req.NOTHING)
        self.reply(self.read(self.manager.run_curves, run))


class ConfigHandler(BaseHandler):
    @tornado.web.authenticated
    @authorized
    async def get(self) -> None:
        self.fields(req.NOTHING)
        self.reply(
            {
                "backend": config.get("backend"),
                "backends": sorted(available()),
                "local_workers": config.get("local.workers"),
            }
        )


class EventsSocket(JupyterHandler, tornado.websocket.WebSocketHandler):
    """Pushes what changed, at most once per interval.

    The envelopes are typed in :mod:`jupyter_cluster.wire.envelopes`.  Messages from the server::

        {"type": "clusters", "clusters": [...]}
        {"type": "jobs", "running": [...], "recent": [...]}
        {"type": "cluster", "name": N, "model": {...}}          the watched cluster, with workers (once per watch)
        {"type": "workers", "name": N, "changed": [...], "removed": [address, ...], "summary"?: {...}}
                                                                 its workers that changed noticeably since
                                                                 (none while idle: see .workers)
        {"type": "topics", "cluster": N, "topics": [...]}
        {"type": "metrics", "cluster": N, "topic": T, "data": {...}}  a watched topic, when it changed
        {"type": "run", "event": "added" | "finished", "run": {...}}
                                                                 a run the server had not listed when the socket
                                                                 opened ("added": its record as GET runs lists it;
                                                                 it may have ended already), or a listed running
                                                                 run that ended ("finished"); one message per run
        {"type": "error", "message": "..."}

    Messages from the panel::

        {"type": "watch", "cluster": N | null, "topics": [T, ...]}
        {"type": "interval", "ms": 1000}
    """

    auth_resource = AUTH_RESOURCE

    @property
    def manager(self) -> ClusterManager:
        return self.settings[SETTINGS_KEY]

    @ws_authenticated
    @authorized  # "read" (a GET upgraded): it pushes what GET reads; the panel's messages only choose what to watch
    async def get(self, *args: Any, **kwargs: Any) -> None:
        res = super().get(*args, **kwargs)
        if res is not None:
            await res

    def open(self, *args: Any, **kwargs: Any) -> None:
        self.interval = 1.0
        self.cluster: str | None = None
        self.topics: list[str] = []
        self.sent: dict[str, Any] = {}
        self.versions: dict[str, int] = {}
        self.feed = WorkerFeed()
        self.model_due = 0.0
        #: run id -> state, as this socket last told (None: not looked yet; what is there then is not news)
        self.run_states: dict[str, Any] | None = None
        self.wake = asyncio.Event()
        self.task = asyncio.get_running_loop().create_task(self._pump())

    def on_message(self, message: str | bytes) -> None:
        try:
            msg = json.loads(message)
            kind = msg["type"]
            if kind in SOCKET_MESSAGES:  # a field the message does not take is refused, as on every route
                SOCKET_MESSAGES[kind].check(msg)
            if kind == "watch":
                cluster = msg.get("cluster")
                self.cluster = validate_name(cluster) if cluster else None
                topics = msg.get("topics") or []
                if not isinstance(topics, list) or not all(isinstance(t, str) for t in topics):
                    raise ValueError("topics must be a list of names")
                self.topics = topics[:20]
                self.sent.pop("cluster", None)
                self.sent.pop("topics", None)
                self.versions = {}
            elif kind == "interval":
                ms = msg["ms"]
                if isinstance(ms, bool) or not isinstance(ms, (int, float)):
                    raise ValueError("ms must be a number")
                self.interval = min(max(float(ms) / 1000, 0.2), 60.0)
            else:
                raise ValueError(f"unknown message type {kind!r}")
        except RecursionError:
            self._send(env.error_message("bad message: JSON nested too deeply."))
            return
        except (ValueError, KeyError, TypeError, ClusterError) as exc:
            self._send(env.error_message(f"bad message: {exc}"))
            return
        self.wake.set()

    def on_close(self) -> None:
        task = getattr(self, "task", None)
        if task is not None:
            task.cancel()

    def _send(self, msg: env.ServerMessage) -> None:
        self.write_message(json.dumps(msg))

    async def _pump(self) -> None:
        try:
            while True:
                try:
                    await self._push()
                except tornado.websocket.WebSocketClosedError:
                    return
                except Exception as exc:  # keep the socket alive; say what went wrong
                    self.log.debug("jupyter-cluster websocket: %s", exc)
                self.wake.clear()
                try:
                    await asyncio.wait_for(self.wake.wait(), self.interval)
                except asyncio.TimeoutError:
                    pass
        except asyncio.CancelledError:
            return

    def _push_runs(self) -> None:
        """A message per run that appeared or ended since the last look (the panel and sweep views need not poll)."""
        runs = self.manager.runs_by_id()
        states = {run_id: rec.get("state") for run_id, rec in runs.items()}
        if self.run_states is not None:
            for run_id, rec in runs.items():
                if run_id not in self.run_states:
                    self._send(env.run_message("added", rec))
                elif self.run_states[run_id] == "running" and rec.get("state") != "running":
                    self._send(env.run_message("finished", rec))
        self.run_states = states

    async def _push(self) -> None:
        m = self.manager
        if self.sent.get("clusters") != m.version:
            self.sent["clusters"] = m.version
            self._send(env.clusters_message(m.clusters()))
        jv = m.jobs_version()
        if self.sent.get("jobs") != jv:
            self.sent["jobs"] = jv
            self._send(env.jobs_message(m.jobs()))
            self._push_runs()
        name = self.cluster
        if not name or name not in m.connections:
            return
        model = None
        now = time.monotonic()
        if self.sent.get("cluster") != name or now >= self.model_due:
            # workers change with heartbeats (about 1/s): asking the scheduler more often finds nothing new
            self.model_due = now + max(self.interval, WORKERS_POLL)
            try:
                model = await m.cluster(name)
            except (ClusterError, OSError, asyncio.TimeoutError):
                model = None
        if model is not None:
            if self.sent.get("cluster") != name:
                # the full list once per watch; then only what changed noticeably (nothing while idle)
                self.sent["cluster"] = name
                self.feed = WorkerFeed()
                self._send(env.cluster_message(name, self.feed.full(model)))
            else:
                diff = self.feed.diff(model)
                if diff is not None:
                    self._send(env.workers_message(name, diff))
        topics = m.topics(name)
        key = [(t["topic"], t["version"]) for t in topics]
        if key != self.sent.get("topics"):
            self.sent["topics"] = key
            self._send(env.topics_message(name, topics))
        for topic in self.topics:
            version = m.topic_version(name, topic)
            if version is None or self.versions.get(topic) == version:
                continue
            data = m.metrics(name, topic)
            self.versions[topic] = data["version"]
            self._send(env.metrics_message(name, topic, data))


def setup_handlers(web_app: Any, manager: ClusterManager) -> None:
    """Register the routes on the Jupyter server's tornado application."""
    base = url_path_join(web_app.settings["base_url"], API)
    web_app.settings[SETTINGS_KEY] = manager
    routes = [
        (r"/clusters/?", ClustersHandler),
        (rf"/clusters/{NAME}/?", ClusterHandler),
        (rf"/clusters/{NAME}/scale/?", ScaleHandler),
        (rf"/clusters/{NAME}/adapt/?", AdaptHandler),
        (rf"/clusters/{NAME}/metrics/?", TopicsHandler),
        (rf"/clusters/{NAME}/metrics/(?P<topic>[^/]+)/?", MetricsHandler),
        (r"/jobs/?", JobsHandler),
        (r"/runs/?", RunsHandler),
        (r"/runs/(?P<run>[A-Za-z0-9_.-]{1,64})/?", RunHandler),
        (r"/runs/(?P<run>[A-Za-z0-9_.-]{1,64})/curves/?", RunCurvesHandler),
        (r"/config/?", ConfigHandler),
        (r"/events/?", EventsSocket),
        *detached.handlers(BaseHandler),  # kept clusters and detached jobs (server.detached)
    ]
    web_app.add_handlers(
        ".*$",
        [(base + pattern, handler) for pattern, handler in routes] + [dashboard.route(web_app.settings["base_url"])],
    )
