"""The host process of a kept cluster: the cluster, its detached jobs, its idle shutdown.

``python -m jupyter_cluster.detached.host --name N --options '{"workers": 2}'``
starts a cluster through :mod:`jupyter_cluster.cluster.session` (owner kind
``"process"``, the record marked ``kept``), prints one JSON line
(``{"ok": true, "name": ..., "address": ...}`` or ``{"ok": false, "error": ...}``)
and then, until it is asked to stop (``%cluster stop NAME``, the panel,
SIGTERM), its scheduler goes away or it has been idle for ``--idle-timeout``
seconds:

* takes the requests of the detached jobs' inbox (run, resume, cancel) and
  drives each job in a thread (:class:`.driver.JobRun`);
* keeps the record's ``extra`` up to date for the panel: ``kept``,
  ``idle_timeout``, ``idle_since`` (None while a job runs or a kernel is
  attached), ``attached`` (the attached kernels), ``jobs_running``.

It runs in a session of its own (the kernel that spawns it starts it so), so a
kernel's death or restart, and a Jupyter server's, leave it alone.  The panel's
own host (:mod:`jupyter_cluster.server.host`) is the same idea without jobs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from typing import Any

#: how often the inbox is read (seconds): the delay between a submit and its start
INBOX_INTERVAL = 0.05
#: how often idleness and attachments are checked (seconds)
IDLE_CHECK_INTERVAL = 1.0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m jupyter_cluster.detached.host", description=__doc__.splitlines()[0])
    p.add_argument("--name")
    p.add_argument("--backend")
    p.add_argument("--options", default="{}", help="the backend's start options, as a JSON object")
    p.add_argument("--idle-timeout", type=float, default=None, help="seconds; 0 = never")
    p.add_argument("--log", help="file that receives the process's output once it has started")
    return p


def _announce(payload: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(payload) + "\n")
    sys.stdout.flush()


def _redirect_output(path: str | None) -> None:
    """After the announcement nobody reads our pipes: send output to a log file."""
    target = os.open(path or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(target, 1)
    os.dup2(target, 2)
    os.close(target)


class Host:
    """The kept cluster's jobs and its idle clock (the main loop of :func:`main`)."""

    def __init__(self, handle: Any, idle_timeout: float):
        self.handle = handle
        self.name = handle.name
        self.idle_timeout = idle_timeout
        self.runs: dict[str, Any] = {}
        self.idle_since: float | None = time.time()
        self._published: dict[str, Any] | None = None

    def take_requests(self) -> bool:
        """Carry out the requests waiting in the inbox; whether there were any."""
        from ..state import job_store
        from .driver import JobRun

        requests = job_store.take_requests(self.name)
        for job, op in requests:
            run = self.runs.get(job)
            if op == "cancel":
                if run is not None and run.alive:
                    run.cancel()
                continue
            if run is not None and run.alive:
                continue  # already running: a second resume has nothing to add
            run = JobRun(job, self.handle, self.name)
            self.runs[job] = run
            run.start()
        return bool(requests)

    def running(self) -> int:
        return sum(1 for r in self.runs.values() if r.alive)

    def attached(self) -> list[dict[str, Any]]:
        from ..state import registry

        return [
            {"pid": a.owner_pid, "kernel_id": a.kernel_id, "since": a.started}
            for a in registry.live_attachments()
            if a.name == self.name and a.address == self.handle.address
        ]

    def check_idle(self, now: float) -> bool:
        """Bring the idle clock and the record up to date; True when the cluster has idled out."""
        attached = self.attached()
        running = self.running()
        if running or attached:
            self.idle_since = None
        elif self.idle_since is None:
            self.idle_since = now
        self._publish(attached, running)
        return bool(
            self.idle_timeout > 0 and self.idle_since is not None and now - self.idle_since >= self.idle_timeout
        )

    def _publish(self, attached: list[dict[str, Any]], running: int) -> None:
        from ..state import registry

        facts = {
            "kept": True,
            "idle_timeout": self.idle_timeout,
            "idle_since": self.idle_since,
            "attached": attached,
            "jobs_running": running,
            "host_pid": os.getpid(),
        }
        if facts == self._published:
            return
        record = registry.read(self.name)
        if record is None or record.owner_pid != os.getpid():
            return
        record.extra = dict(record.extra or {}, **facts)
        registry.write(record)
        self.handle.extra.update(facts)
        self._published = facts

    def end_jobs(self, why: str) -> None:
        """The cluster stops: cancel what still runs, and say why in each job's metadata."""
        from ..state import job_store

        for run in self.runs.values():
            if run.alive:
                run.cancel()
        for run in self.runs.values():
            run.thread.join(timeout=10)
            meta = job_store.read_meta(run.name) or {}
            if meta.get("state") == "cancelled" and meta.get("reason") == "cancelled on request":
                job_store.update_meta(run.name, reason=why)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        options = json.loads(args.options)
    except ValueError:
        options = None
    if not isinstance(options, dict):
        _announce({"ok": False, "error": "--options must be a JSON object."})
        return 1
    return serve(args.name, args.backend, options, args.idle_timeout, args.log)


def serve(
    name: str | None,
    backend: str | None,
    options: dict[str, Any],
    idle_timeout: float | None,
    log: str | None,
    owner_kind: str = "process",
) -> int:
    """Start the cluster, announce it, then host it until it is stopped or idles out; the exit code.

    Parameters
    ----------
    idle_timeout : float or None
        Seconds (0 = never); None: ``jupyter-cluster.detached.idle-timeout``.
    owner_kind : str
        ``"process"`` for a kept cluster a kernel started, ``"panel"`` for the
        panel's host (:mod:`jupyter_cluster.server.host`).
    """
    from ..cluster import session
    from ..cluster.control import listen
    from ..errors import ClusterError
    from . import kept

    session.set_owner_kind(owner_kind)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        idle = idle_timeout if idle_timeout is not None else kept.idle_seconds()
        handle = session.start(name=name, backend=backend, **options)
        if isinstance(handle, str):
            raise ClusterError("--dry-run starts nothing, so there is nothing to keep; drop --keep.")
    except ClusterError as exc:
        _announce({"ok": False, "error": str(exc)})
        return 1
    except Exception as exc:  # anything else still has to reach the kernel as one message
        _announce({"ok": False, "error": f"the cluster could not start: {type(exc).__name__}: {exc}"})
        return 1
    host = Host(handle, idle)
    host.check_idle(time.time())  # the record says "kept" before anyone is told the cluster runs
    listen(handle, on_stop=stop.set)
    _announce(
        {
            "ok": True,
            "name": handle.name,
            "address": handle.address,
            "dashboard_link": handle.dashboard_link,
            "pid": os.getpid(),
        }
    )
    _redirect_output(log)
    why = f"the cluster {handle.name!r} was stopped while the job ran"
    next_check = 0.0
    while not stop.wait(INBOX_INTERVAL):
        if handle.closed or handle.scheduler_gone():
            why = f"the scheduler of {handle.name!r} went away while the job ran"
            break
        try:
            taken = host.take_requests()
        except Exception:  # a request file we cannot read must not end the cluster
            taken = False
        now = time.time()
        if now >= next_check or taken:  # a job that starts shows at once in the record
            next_check = now + IDLE_CHECK_INTERVAL
            if host.check_idle(now):
                print(
                    f"jupyter_cluster: cluster {handle.name!r} stops: idle for {idle:g} s "
                    "(no running job, no attached kernel)",
                    flush=True,
                )
                break
    host.end_jobs(why)
    if not handle.closed:
        handle.close()
    _tidy(handle.name, log if owner_kind == "process" else None)  # the server names and keeps its hosts' logs
    return 0


def _tidy(name: str, log: str | None) -> None:
    """A clean stop leaves neither its log nor its empty inbox behind (a crash leaves the log to read)."""
    from ..state import job_store

    for remove, path in ((os.remove, log), (os.rmdir, os.path.join(job_store.store_dir(), job_store.INBOX, name))):
        if path:
            try:
                remove(path)
            except OSError:  # gone already, or a request arrived after the stop: left for the next host
                pass


if __name__ == "__main__":
    sys.exit(main())
