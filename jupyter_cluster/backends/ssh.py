"""SSH hosts: Dask's ``SSHCluster`` (asyncssh) started from the notebook.

``%cluster start --backend ssh --hosts a,b,c`` runs the scheduler on the
**first host** (Dask's own convention: the scheduler then sits beside the
workers, and keeps running the cluster's bookkeeping if the notebook's link is
slow) and one worker process per remaining host; ``--workers N`` spreads N
workers over them round-robin, and one host alone runs both.  Hosts need SSH
login by key and the same Python environment as the notebook (distributed and
jupyter_cluster importable by ``jupyter-cluster.ssh.remote-python``, by default
the path of this kernel's own interpreter).

How it connects (``jupyter-cluster.ssh`` in dask.config): ``username``,
``port``, ``client-keys`` (private key files), ``known-hosts`` (an unknown or
changed host key is refused, never accepted silently), ``connect-timeout``.
Before anything starts, every host is logged into once, in parallel: a host that
refuses, a key it does not accept, an unknown host key or a Python without
distributed gives one sentence within ``connect-timeout``.

Security: TLS by default.  Per-cluster credentials (as for local clusters,
:func:`jupyter_cluster.state.credentials.new_security`) are copied to each host into
``~/.cache/jupyter-cluster/`` (0600 in a 0700 folder, written under
``umask 077``) and handed to the remote scheduler and workers through
``DASK_DISTRIBUTED__COMM__TLS__*`` variables; stop deletes them.  The remote
scheduler's dashboard is off (it would be an unauthenticated port on the host).

Lifecycle: ``%cluster stop`` shuts the scheduler and workers down and closes
the SSH sessions.  Every remote Dask process started here also watches its SSH
session (:func:`dask_setup`, a Dask preload): when the session ends — the
kernel was killed with ``kill -9``, the notebook's machine lost the network —
it closes itself, so nothing is left on a host.  Workers also stop
``jupyter-cluster.ssh.death-timeout`` after they lose the scheduler.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import shlex
import socket
import sys
import threading
import time
import uuid
from typing import Any

from .. import config
from ..errors import ClusterError
from . import Backend, StartedCluster
from .cli import MEMORY_LIMIT, PORT, THREADS, TLS, WORKERS, Option

#: set in the environment of the remote processes this backend starts: their preload then watches stdin
WATCH_ENV = "JUPYTER_CLUSTER_SSH_WATCH"
#: the Dask preload (a module with ``dask_setup``) every remote scheduler and nanny loads
PRELOAD = "jupyter_cluster.backends.ssh"
#: where credentials are kept on a host, relative to its $HOME
REMOTE_DIR = ".cache/jupyter-cluster"
#: how long a remote process whose session ended may take to close before it exits outright (seconds)
CLOSE_GRACE = 20.0


# -- the remote side: a Dask preload ----------------------------------------------------------
def dask_setup(server: Any) -> None:
    """Dask preload: close this scheduler or nanny when its SSH session ends.

    ``SSHCluster`` starts each remote process as the command of an SSH session
    whose standard input stays open until the session ends.  When the notebook
    stops the cluster, the session is closed after Dask's own shutdown; when the
    notebook's process dies (``kill -9``), sshd sees the connection drop and
    closes the session, and nothing else would ever stop the process.  Reading
    standard input to its end notices both; the server is then closed (a nanny
    takes its worker with it) and, if that hangs, the process exits.  Processes
    not started by this backend (no ``JUPYTER_CLUSTER_SSH_WATCH``) are left alone.
    """
    if os.environ.get(WATCH_ENV) != "1":
        return
    loop = server.loop

    async def close() -> None:
        try:
            await server.close()
        except Exception:  # closing anyway; the watchdog below ends the process
            pass

    def watch() -> None:
        try:
            while os.read(0, 65536):
                pass
        except OSError:
            pass
        try:
            loop.add_callback(close)
        except Exception:  # the loop is gone: the process is exiting already
            pass
        time.sleep(CLOSE_GRACE)
        os._exit(0)

    threading.Thread(target=watch, name="jupyter-cluster-ssh-watch", daemon=True).start()


# -- options ---------------------------------------------------------------------------------
def parse_hosts(hosts: Any) -> list[str]:
    """``--hosts`` as a list: "a,b,c", or a list; the configured ``jupyter-cluster.ssh.hosts`` if none."""
    if hosts is None:
        hosts = config.get("ssh.hosts") or []
    items = hosts.split(",") if isinstance(hosts, str) else [str(h) for h in hosts]
    found = [h.strip() for h in items if h.strip()]
    if not found:
        raise ClusterError(
            "the ssh backend needs hosts: give --hosts a,b,c (the first runs the scheduler) "
            "or set jupyter-cluster.ssh.hosts."
        )
    for h in found:
        if any(c.isspace() for c in h) or h.startswith("-") or "/" in h:
            raise ClusterError(f"{h!r} is not a host name or address; give --hosts as names separated by commas.")
    return found


def _ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _paths(value: Any) -> list[str] | None:
    if value in (None, "", []):
        return None
    items = [value] if isinstance(value, str) else list(value)
    return [os.path.expanduser(str(v)) for v in items]


def connect_options() -> dict[str, Any]:
    """Keyword arguments for ``asyncssh.connect`` from ``jupyter-cluster.ssh`` in dask.config."""
    options: dict[str, Any] = {"connect_timeout": config.timeout_seconds("ssh.connect-timeout")}
    if config.get("ssh.username"):
        options["username"] = str(config.get("ssh.username"))
    if config.get("ssh.port"):
        options["port"] = int(config.get("ssh.port"))
    keys = _paths(config.get("ssh.client-keys"))
    if keys is not None:
        missing = [k for k in keys if not os.path.isfile(k)]
        if missing:
            raise ClusterError(f"the SSH key file {missing[0]} does not exist; fix jupyter-cluster.ssh.client-keys.")
        options["client_keys"] = keys
    known = _paths(config.get("ssh.known-hosts"))
    if known is not None:
        if not os.path.isfile(known[0]):
            raise ClusterError(f"the known_hosts file {known[0]} does not exist; fix jupyter-cluster.ssh.known-hosts.")
        options["known_hosts"] = known[0] if len(known) == 1 else known
    return options


def remote_python() -> str:
    """The Python the hosts run: ``jupyter-cluster.ssh.remote-python``, else this interpreter's path."""
    return str(config.get("ssh.remote-python") or sys.executable)


# -- the notebook side: checks and credentials, over one SSH login per host --------------------
def _describe(host: str, options: dict[str, Any], exc: BaseException) -> str:
    """One sentence for a failed SSH login."""
    import asyncssh

    port = options.get("port", 22)
    user = options.get("username") or "this user"
    if isinstance(exc, asyncssh.PermissionDenied):
        keys = ", ".join(options.get("client_keys") or []) or "the default keys (~/.ssh/id_*, ssh-agent)"
        return (
            f"SSH login to {host} as {user} was refused: the host does not accept {keys}; "
            "add the public key to its ~/.ssh/authorized_keys or set jupyter-cluster.ssh.client-keys."
        )
    if isinstance(exc, asyncssh.HostKeyNotVerifiable):
        known = options.get("known_hosts") or "~/.ssh/known_hosts"
        return (
            f"the SSH host key of {host} is not in {known} or does not match it, so the host is not trusted; "
            f"check the key and add it (ssh-keyscan -p {port} {host}) or set jupyter-cluster.ssh.known-hosts."
        )
    if isinstance(exc, ConnectionRefusedError):
        return f"{host} refused the SSH connection on port {port}; check that sshd runs there and jupyter-cluster.ssh.port."
    if isinstance(exc, socket.gaierror):
        return f"the host name {host!r} does not resolve; check --hosts."
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return (
            f"{host} did not answer SSH on port {port} within {options.get('connect_timeout', 0):g} s; "
            "check the host name and the network (jupyter-cluster.ssh.connect-timeout)."
        )
    if isinstance(exc, OSError):
        return f"SSH to {host} on port {port} failed: {exc.strerror or exc}; check the host and the network."
    reason = getattr(exc, "reason", None) or str(exc) or type(exc).__name__
    return f"SSH to {host} failed: {str(reason).rstrip('.')}; check the host and jupyter-cluster.ssh settings."


async def _prepare_host(host: str, options: dict[str, Any], python: str, pem: str | None, tag: str) -> str:
    """Log into ``host`` once: check its Python, copy the credentials; returns its $HOME."""
    import asyncssh

    try:
        conn = await asyncssh.connect(host, **options)
    except (OSError, asyncssh.Error, asyncio.TimeoutError) as exc:
        raise ClusterError(_describe(host, options, exc)) from None
    try:
        folder = f'"$HOME"/{REMOTE_DIR}'
        steps = []
        if pem is not None:
            steps.append(
                f"umask 077 && mkdir -p {folder} && chmod 700 {folder} && cat > {folder}/{tag}.pem "
                f"&& chmod 600 {folder}/{tag}.pem"
            )
        # found without importing them (an import of distributed takes seconds on a busy host)
        check = "import importlib.util as u, sys; sys.exit(0 if u.find_spec('distributed') and u.find_spec('jupyter_cluster') else 3)"
        steps.append(f'{shlex.quote(python)} -c "{check}" && echo "HOME=$HOME"')
        try:
            result = await asyncio.wait_for(
                conn.run(" && ".join(steps), input=pem or "", check=False),
                timeout=max(60.0, options.get("connect_timeout", 10) * 6),
            )
        except (asyncssh.Error, OSError, asyncio.TimeoutError) as exc:
            raise ClusterError(_describe(host, options, exc)) from None
        out = str(result.stdout or "")
        home = next((line[5:] for line in out.splitlines() if line.startswith("HOME=")), None)
        if result.exit_status != 0 or home is None:
            err = str(result.stderr or "").strip().splitlines()
            detail = (
                "it cannot find distributed or jupyter_cluster"
                if result.exit_status == 3
                else (err[-1] if err else f"exit status {result.exit_status}")
            )
            raise ClusterError(
                f"{host} cannot run Dask workers with {python} ({detail}); install distributed and jupyter_cluster "
                "there, or set jupyter-cluster.ssh.remote-python."
            )
        return home
    finally:
        conn.close()
        await conn.wait_closed()


async def _remove_remote(host: str, options: dict[str, Any], tag: str) -> None:
    import asyncssh

    try:
        async with await asyncssh.connect(host, **options) as conn:
            await conn.run(f'rm -f "$HOME"/{REMOTE_DIR}/{tag}.pem', check=False)
    except (OSError, asyncssh.Error, asyncio.TimeoutError):
        pass  # the host is gone; the file is readable by this user only


def _run(coro_fn: Any, timeout: float) -> Any:
    """Run a coroutine on a private event loop in a thread (the kernel's own loop may be running)."""
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(1, thread_name_prefix="jupyter-cluster-ssh")
    try:
        return pool.submit(asyncio.run, coro_fn()).result(timeout)
    finally:
        pool.shutdown(wait=False)


def prepare_hosts(hosts: list[str], options: dict[str, Any], python: str, pem: str | None, tag: str) -> dict[str, str]:
    """Log into every host at once; returns host → $HOME, or raises the first failure's sentence."""

    async def all_hosts() -> list[Any]:
        return await asyncio.gather(
            *(_prepare_host(h, options, python, pem, tag) for h in hosts), return_exceptions=True
        )

    results = _run(all_hosts, timeout=max(90.0, options.get("connect_timeout", 10) * 8))
    for result in results:
        if isinstance(result, BaseException):
            if pem is not None:
                remove_remote_credentials(hosts, options, tag)
            raise result
    return dict(zip(hosts, results))


def remove_remote_credentials(hosts: list[str], options: dict[str, Any], tag: str) -> None:
    """Delete the credential copies on ``hosts`` (no error for a host that is gone)."""

    async def all_hosts() -> None:
        await asyncio.gather(*(_remove_remote(h, options, tag) for h in hosts), return_exceptions=True)

    try:
        _run(all_hosts, timeout=max(30.0, options.get("connect_timeout", 10) * 2))
    except Exception:  # best effort: a stop must still finish
        pass


def remote_command_prefix(home: str, tag: str | None, python: str) -> str:
    """What ``SSHCluster`` runs as "Python" on a host: the interpreter, with TLS settings and the watch flag."""
    env = [f"{WATCH_ENV}=1"]
    if tag is not None:
        path = f"{home.rstrip('/')}/{REMOTE_DIR}/{tag}.pem"
        settings = {"DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "True", "DASK_DISTRIBUTED__COMM__TLS__CA_FILE": path}
        for role in ("SCHEDULER", "WORKER", "CLIENT"):
            settings[f"DASK_DISTRIBUTED__COMM__TLS__{role}__CERT"] = path
            settings[f"DASK_DISTRIBUTED__COMM__TLS__{role}__KEY"] = path
        env += [f"{k}={shlex.quote(v)}" for k, v in settings.items()]
    return "env " + " ".join(env) + " " + shlex.quote(python)


class _RemoteLines(logging.Handler):
    """What the remote processes print while the cluster starts, kept instead of shown.

    ``SSHCluster`` logs every line a remote scheduler or worker writes to its
    standard error (at INFO, dozens per start) through ``distributed.deploy.ssh``.
    A notebook shows none of them; a failed start quotes the last error line.
    """

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def last_error(self) -> str | None:
        for line in reversed(self.lines):
            text = line.strip()
            if "Error" in text or "error" in text or "Exception" in text:
                return text.split(" - ")[-1][:300]
        return None

    def __enter__(self) -> _RemoteLines:
        logger = logging.getLogger("distributed.deploy.ssh")
        self._saved = (logger.level, logger.propagate)
        logger.addHandler(self)
        logger.setLevel(logging.INFO)
        logger.propagate = False
        return self

    def __exit__(self, *exc: Any) -> None:
        logger = logging.getLogger("distributed.deploy.ssh")
        logger.removeHandler(self)
        # later lines (workers added by scale) stay quiet too; warnings still show
        logger.setLevel(max(self._saved[0], logging.WARNING))
        logger.propagate = self._saved[1]


def _unwrap(exc: BaseException) -> BaseException:
    """The first cause of a failed cluster start that says more than "Cluster failed to start"."""
    seen = 0
    current: BaseException | None = exc
    while current is not None and seen < 10:
        if isinstance(current, ClusterError) or not (
            isinstance(current, RuntimeError) and "failed to start" in str(current)
        ):
            return current
        current = current.__cause__ or current.__context__
        seen += 1
    return exc


class SSHBackend(Backend):
    """A Dask cluster on SSH hosts through ``distributed.deploy.ssh.SSHCluster``."""

    name = "ssh"
    cli_options = (
        Option("hosts", "the SSH hosts; the first runs the scheduler", None, "A,B,C"),
        WORKERS,
        THREADS,
        MEMORY_LIMIT,
        PORT,
        TLS,
    )
    api_options = ("name",)

    def start(
        self,
        name: str | None = None,
        hosts: Any = None,
        workers: int | None = None,
        threads: int | None = None,
        memory_limit: Any = None,
        port: int | None = None,
        tls: Any = None,
        **options: Any,
    ) -> StartedCluster:
        self.check_options(options)
        try:
            import asyncssh  # noqa: F401
        except ImportError:
            raise ClusterError(
                "the ssh backend needs the asyncssh package; install it with pip install 'jupyter-cluster[hpc]'."
            ) from None
        from distributed.deploy.ssh import SSHCluster

        from ..state.credentials import forget_security, new_security, pem_path, written_identity

        host_list = parse_hosts(hosts)
        scheduler_host, worker_hosts = host_list[0], (host_list[1:] or host_list[:1])
        threads = threads if threads is not None else int(config.get("ssh.threads") or 1)
        workers = workers if workers is not None else len(worker_hosts)
        if workers < 1 or threads < 1:
            raise ClusterError("--workers and --threads must be 1 or more for the ssh backend.")
        if port is not None and not (isinstance(port, int) and 0 <= port <= 65535):
            raise ClusterError(f"--port must be a TCP port from 0 to 65535 (0 or none picks a free one), not {port}.")
        use_tls = config.get("ssh.tls") if tls is None else tls
        use_tls = str(use_tls).lower() in ("true", "yes", "1") if isinstance(use_tls, str) else bool(use_tls)
        ssh_options = connect_options()
        python = remote_python()
        cred_name = name or f"ssh-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tag = f"{cred_name}-{uuid.uuid4().hex[:8]}" if use_tls else None
        security = identity = None
        pem = None
        unique_hosts = list(dict.fromkeys(host_list))
        if use_tls:
            security = new_security(cred_name)
            identity = written_identity(cred_name)
            with open(pem_path(cred_name)) as f:
                pem = f.read()
        try:
            homes = prepare_hosts(unique_hosts, ssh_options, python, pem, tag or "")
        except BaseException:
            if security is not None:
                forget_security(cred_name, identity)
            raise
        placed = [worker_hosts[i % len(worker_hosts)] for i in range(workers)]
        all_hosts = [scheduler_host, *placed]
        # the dashboard would be an unauthenticated port on the host: off, and its HTTP server on loopback
        scheduler_options: dict[str, Any] = {"port": port or 0, "dashboard": False, "dashboard_address": "127.0.0.1:0"}
        if use_tls:
            scheduler_options["protocol"] = "tls"
        if _ip_literal(scheduler_host):
            scheduler_options["host"] = scheduler_host
        scheduler_options["preload"] = [PRELOAD]
        worker_options: dict[str, Any] = {
            "nthreads": threads,
            "death_timeout": config.timeout_seconds("ssh.death-timeout"),
            "preload_nanny": [PRELOAD],
            "dashboard_address": "127.0.0.1:0",
        }
        if memory_limit is not None:
            worker_options["memory_limit"] = memory_limit
        per_host_python = [remote_command_prefix(homes[h], tag, python) for h in all_hosts]
        per_host_options = [dict(ssh_options) for _ in all_hosts]
        cleanup: list = []

        def forget() -> None:
            if tag is not None:
                remove_remote_credentials(unique_hosts, ssh_options, tag)
            if security is not None:
                forget_security(cred_name, identity)

        lines = _RemoteLines()
        before = _spec_clusters()
        try:
            with lines:
                cluster = SSHCluster(
                    all_hosts,
                    connect_options=per_host_options,
                    worker_options=worker_options,
                    scheduler_options=scheduler_options,
                    remote_python=per_host_python,
                    security=security,
                )
        except BaseException as exc:
            if not isinstance(exc, Exception):  # the stop button (KeyboardInterrupt): the start goes on without it
                for cut_short in _spec_clusters():
                    if cut_short not in before and _scheduler_host(cut_short) == scheduler_host:
                        end_cut_short_start(cut_short)
            forget()
            cause = _unwrap(exc)
            if isinstance(cause, (ClusterError, TypeError)) or not isinstance(cause, Exception):
                raise
            text = lines.last_error() or str(cause).strip() or type(cause).__name__
            raise ClusterError(
                f"the SSH cluster on {', '.join(unique_hosts)} could not start: {text.rstrip('.')}."
            ) from exc
        _round_robin_scale_up(cluster, worker_hosts, worker_options, python, homes, tag, ssh_options)
        loop = cluster.loop
        if loop is not None:
            loop.add_callback(_note_scheduler_exit, cluster.scheduler)
        _end_sessions_on_close(cluster)
        _drain_remote_output(cluster)
        cleanup.append(forget)
        return StartedCluster.of(
            cluster,
            dashboard_link=None,  # the scheduler's dashboard is off (it would listen on a remote host)
            security=security,
            cleanup=cleanup,
            extra={"hosts": unique_hosts, "scheduler_host": scheduler_host},
        )


def _spec_clusters() -> list[Any]:
    """Every Dask ``SpecCluster`` of this process now (an SSH cluster is one, from the moment it is made)."""
    from distributed.deploy.spec import SpecCluster

    return list(SpecCluster._instances)


def _scheduler_host(cluster: Any) -> Any:
    spec = getattr(cluster, "scheduler_spec", None) or {}
    return (spec.get("options") or {}).get("address")


def end_cut_short_start(cluster: Any, timeout: float = 20.0) -> None:
    """End what an interrupted SSH cluster start left running: its SSH sessions and its event loop.

    The stop button raises ``KeyboardInterrupt`` in the kernel while Dask's
    ``SSHCluster`` waits for its start on the cluster's own event loop thread;
    Dask then cancels the start, but nothing closes the SSH sessions it had
    opened, and the cluster object never reaches the caller: the remote
    scheduler and workers ran on until the kernel exited, listed nowhere
    (issue 37.4).  Their sessions are closed here; the remote processes end
    with them (:func:`dask_setup`).
    """
    from distributed.core import Status

    async def end_sessions() -> None:
        await asyncio.sleep(0)  # after the start's cancellation, which Dask queued first on this loop
        processes = [getattr(cluster, "scheduler", None), *getattr(cluster, "workers", {}).values()]
        processes += list(getattr(cluster, "_created", ()))
        connections = [c for c in (getattr(p, "connection", None) for p in processes) if c is not None]
        for connection in connections:
            connection.close()
        for connection in connections:
            try:
                await asyncio.wait_for(connection.wait_closed(), 5)
            except Exception:  # closed or broken: its processes end all the same
                pass

    try:
        if cluster.loop is not None and cluster.loop.asyncio_loop.is_running():
            cluster.sync(end_sessions, callback_timeout=timeout)
    except Exception:  # the loop is gone: so are the sessions it held
        pass
    finally:
        cluster.status = Status.closed  # nothing left to close at exit (Dask's atexit closes live ones)
        try:
            cluster._loop_runner.stop()
        except Exception:
            pass


#: how often new remote processes are looked for, to read their output (seconds)
DRAIN_INTERVAL = 2.0


def _drain_remote_output(cluster: Any) -> None:
    """Keep reading what the remote processes write, once they have started.

    Dask's SSH process objects read a remote process's standard error only
    until it says it started; after that nobody reads it, and once the SSH
    channel's window and buffers are full (a few MiB of logs, or of what tasks
    print), the remote process blocks in its next write, its event loop and
    all.  Lines go to the ``distributed.deploy.ssh`` logger at DEBUG.
    """
    from distributed.core import Status
    from tornado.ioloop import PeriodicCallback

    logger = logging.getLogger("distributed.deploy.ssh")

    async def drain(stream: Any) -> None:
        try:
            while True:
                line = await stream.readline()
                if not line:
                    return
                logger.debug("%s", str(line).rstrip())
        except Exception:  # the session ended
            return

    def look() -> None:
        if cluster.status in (Status.closing, Status.closed):
            callback.stop()
            return
        for process in [cluster.scheduler, *cluster.workers.values()]:
            proc = getattr(process, "proc", None)
            if (
                proc is None
                or getattr(proc, "_jc_drained", False)
                or getattr(process, "status", None) != Status.running
            ):
                continue  # not started yet: its start still reads its first lines
            proc._jc_drained = True
            asyncio.ensure_future(drain(proc.stderr))
            asyncio.ensure_future(drain(proc.stdout))

    callback = PeriodicCallback(look, DRAIN_INTERVAL * 1000)
    loop = cluster.loop
    if loop is not None:
        loop.add_callback(callback.start)


def _end_sessions_on_close(cluster: Any) -> None:
    """Make the cluster's close end every SSH session it leaves open.

    ``SpecCluster`` closes the scheduler's session only when it shuts the
    scheduler down itself, which a stop skips when the client had lost the
    scheduler, and a close cut short by its timeout ends none; the cluster's
    event loop stops after it, so later is too late.  The remote processes
    end with their sessions (:func:`dask_setup`).
    """
    close = cluster._close

    async def close_then_end_sessions() -> None:
        try:
            await close()
        finally:
            for process in [getattr(cluster, "scheduler", None), *getattr(cluster, "_created", ())]:
                connection = getattr(process, "connection", None)
                if connection is not None:
                    connection.close()

    cluster._close = close_then_end_sessions


async def _note_scheduler_exit(process: Any) -> None:
    """Mark the cluster's scheduler closed when its remote process ends (its host died, it was orphaned).

    Dask's SSH process objects stay "running" after the remote process has
    gone; closing the cluster would then ask the dead scheduler to retire the
    workers, and wait out the whole close timeout before ending any SSH
    session.  Marked closed, the close goes straight to ending the sessions.
    """
    from distributed.core import Status

    try:
        await process.proc.wait_closed()
    except Exception:  # the connection broke: the process is gone all the same
        pass
    if process.status == Status.running:
        process.status = Status.closed


def _round_robin_scale_up(
    cluster: Any,
    worker_hosts: list[str],
    worker_options: dict[str, Any],
    python: str,
    homes: dict[str, str],
    tag: str | None,
    ssh_options: dict[str, Any],
) -> None:
    """Let ``scale(n)`` add workers on the host with the fewest (``SSHCluster`` has no worker template)."""
    from distributed.deploy.ssh import Worker

    def new_worker_spec() -> dict[str, Any]:
        counts = {h: 0 for h in worker_hosts}
        for spec in cluster.worker_spec.values():
            host = spec.get("options", {}).get("address")
            if host in counts:
                counts[host] += 1
        host = min(worker_hosts, key=lambda h: counts[h])
        name = cluster._new_worker_name(cluster._i)
        while name in cluster.worker_spec:
            cluster._i += 1
            name = cluster._new_worker_name(cluster._i)
        return {
            name: {
                "cls": Worker,
                "options": {
                    "address": host,
                    "connect_options": dict(ssh_options),
                    "kwargs": dict(worker_options),
                    "worker_class": "distributed.Nanny",
                    "remote_python": remote_command_prefix(homes[host], tag, python),
                },
            }
        }

    cluster.new_worker_spec = new_worker_spec
    cluster.new_spec = {"scale-up": "round robin over the worker hosts"}  # SpecCluster scales only with a template
