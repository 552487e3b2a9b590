"""The panel's view of work that outlives the kernel: kept clusters and detached jobs.

Routes (under ``<base_url>/jupyter-cluster/api/``, Jupyter's auth and the
``jupyter_cluster`` authorizer resource, as every other route)::

    GET  detached                  {"jobs": [...], "kept": [...]}: every detached job of this
                                   user (progress, notebook, cell, state, the code that fetches
                                   its results) and every kept cluster (idle countdown, attached kernels)
    POST detached/NAME/cancel      cancel a detached job

The server reads the same 0700 store as the kernels (this user's; another
user's folder is refused), so no one else's jobs are listed.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import tornado.web
from jupyter_server.auth.decorator import authorized

from ..detached import jobs as detached_jobs
from ..errors import ClusterError
from ..state import job_store, registry
from ..wire.requests import NOTHING


def fetch_code(name: str) -> str:
    """The code a notebook runs to get a detached job's results."""
    return f"import jupyter_cluster as jc\nresults = jc.job({name!r}).result()"


def kept_clusters(now: float | None = None) -> list[dict[str, Any]]:
    """The kept clusters, with their idle countdown and who is attached."""
    now = time.time() if now is None else now
    rows = []
    for record in registry.live_records():
        extra = record.extra or {}
        if record.attached or not extra.get("kept"):
            continue
        timeout = float(extra.get("idle_timeout") or 0)
        since = extra.get("idle_since")
        stops_in = max(0.0, since + timeout - now) if timeout > 0 and isinstance(since, (int, float)) else None
        rows.append(
            {
                "name": record.name,
                "backend": record.backend,
                "idle_timeout": timeout,
                "idle_since": since,
                "stops_in": stops_in,
                "attached": list(extra.get("attached") or []),
                "jobs_running": int(extra.get("jobs_running") or 0),
            }
        )
    return rows


def snapshot() -> dict[str, Any]:
    jobs = detached_jobs.jobs()
    for row in jobs:
        row["fetch_code"] = fetch_code(row["name"])
    return {"jobs": jobs, "kept": kept_clusters()}


def handlers(base: type) -> list[tuple[str, type]]:
    """The routes, with handler classes built on the server's ``BaseHandler`` (JSON errors, authorizer)."""

    class DetachedList(base):
        @tornado.web.authenticated
        @authorized
        async def get(self) -> None:
            self.fields(NOTHING)  # an unknown field or query argument is a 400 naming it, as on every route
            try:
                data = await asyncio.to_thread(snapshot)
            except ClusterError as exc:
                self.fail(400, str(exc))
            self.reply(data)

    class DetachedCancel(base):
        @tornado.web.authenticated
        @authorized
        async def post(self, name: str) -> None:
            self.fields(NOTHING)
            if not job_store.valid_name(name):
                self.fail(400, f"{name[:64]!r} is not a valid job name.")
            try:
                job = detached_jobs.job(name)
                state = await asyncio.to_thread(job.cancel, 10.0)
            except ClusterError as exc:
                self.fail(404, str(exc))
            self.reply({"name": name, "state": state})

    return [
        (r"/detached/?", DetachedList),
        (r"/detached/(?P<name>[^/]+)/cancel/?", DetachedCancel),
    ]
