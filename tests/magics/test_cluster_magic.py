"""%cluster and the Python lifecycle API on real local clusters and a real IPython shell."""

from __future__ import annotations

import socket

import pytest
from IPython.core.error import UsageError

import jupyter_cluster as jc
from jupyter_cluster.cluster import session
from jupyter_cluster.state import registry

from ..conftest import wait_for


@pytest.fixture(autouse=True)
def _no_leftover_clusters():
    yield
    session.stop_all()


def run(ip, line):
    return ip.run_line_magic("cluster", line)


def test_start_status_list_stop(ip, capsys):
    handle = run(ip, "start --workers 2 --threads 1 --memory-limit 1GiB --name sweep")
    assert handle.name == "sweep" and handle.backend == "local"
    assert handle.address.startswith("tls://127.0.0.1:")  # TLS by default (issue 18.2)
    assert handle.dashboard_link and handle.dashboard_link.endswith(
        "/jupyter-cluster/dashboard/sweep/status"
    )  # through the Jupyter server
    model = handle.model()
    assert model["n_workers"] == 2 and model["cores"] == 2
    assert all(w["memory_limit"] == 2**30 for w in model["workers"])
    assert jc.current() is handle
    assert run(ip, "") is handle  # bare %cluster shows the current cluster
    assert "sweep" in handle._repr_html_()

    run(ip, "list")
    out = capsys.readouterr().out
    assert "sweep" in out and handle.address in out

    [record] = [r for r in jc.clusters() if r["name"] == "sweep"]
    assert record["backend"] == "local" and record["current"] and record["owner_kind"] == "kernel"

    run(ip, "stop")
    assert "Stopped cluster 'sweep'" in capsys.readouterr().out
    assert registry.read("sweep") is None
    assert jc.current() is None
    with pytest.raises(UsageError, match="nothing to stop"):
        run(ip, "stop")


def test_two_local_clusters_get_unique_names_and_connect_by_name(ip):
    a = jc.start(workers=1)
    b = jc.start(workers=1)
    assert a.name != b.name and a.address != b.address
    assert jc.current() is b
    # Attaching by registry name to a cluster this kernel holds just makes it current.
    assert run(ip, f"connect {a.name}") is a
    assert jc.current() is a
    with pytest.raises(UsageError, match="already exists"):
        jc_start_line = f"start --workers 1 --name {a.name}"
        run(ip, jc_start_line)
    assert a.client.submit(lambda x: x + 1, 1).result() == 2
    assert b.client.submit(lambda x: x * 3, 2).result() == 6


def test_connect_by_address_detaches_without_shutting_down(ip):
    owner = jc.start(workers=1, name="owner")
    attached = run(ip, f"connect {owner.address}")
    assert attached.backend == "address" and attached is not owner
    assert attached.client.submit(pow, 2, 5).result() == 32
    with pytest.raises(UsageError, match="attached by address"):
        run(ip, "scale 3")
    run(ip, f"stop {attached.name}")
    # The scheduler we only attached to keeps running.
    assert owner.client.submit(pow, 3, 2).result() == 9


def test_scale_adapt_restart(ip):
    handle = run(ip, "start --workers 1")
    run(ip, "scale 2")
    handle.wait_for_workers(2, timeout=60)
    assert handle.model()["n_workers"] == 2
    pid_before = set(handle.client.run(lambda: __import__("os").getpid()).values())
    run(ip, "restart")
    pid_after = set(handle.client.run(lambda: __import__("os").getpid()).values())
    assert pid_before.isdisjoint(pid_after)
    run(ip, "adapt --minimum 1 --maximum 3")
    with pytest.raises(UsageError, match="minimum"):
        run(ip, "adapt --minimum 3 --maximum 1")


@pytest.mark.parametrize(
    "line, message",
    [
        ("start --bogus", "unrecognized arguments: --bogus"),
        ("frobnicate", "invalid choice"),
        ("scale many", "invalid int value"),
        ("start --backend nosuch", "unknown backend 'nosuch'"),
        ("start --name 'bad name'", "not a valid cluster name"),
        ("connect nothere", "no cluster named 'nothere' is running"),
        ("stop nothere", "no cluster named 'nothere' is held"),
        ("start --backend address --workers 2", "does not take --workers"),
        ("restart", "no cluster is running in this kernel"),
        ("start --workers 100000", "--workers 100000 is more worker processes than this machine can run"),
        ("start --port 99999", "--port must be a TCP port from 0 to 65535"),
        ("start --port -1", "--port must be a TCP port from 0 to 65535"),
        ("start --workers 0", "--workers 0 starts a cluster that can run nothing; ask for 1 or more"),
        ("start --workers 0 --no-wait --name idle", "--workers 0 starts a cluster that can run nothing"),
        ("start --backend address --workers 0", "--workers 0 starts a cluster that can run nothing"),
        # OverflowError from the backend before, or a nanny's traceback and "Nanny failed to start"
        ("start --memory-limit 1e999GB", '--memory-limit must be a size such as "2GiB", "auto", or a whole number'),
        ("start --memory-limit=-1GB", '--memory-limit must be a size such as "2GiB"'),
        ("start --memory-limit nanGB", '--memory-limit must be a size such as "2GiB"'),
        ("start --memory-limit ''", '--memory-limit must be a size such as "2GiB"'),
    ],
)
def test_bad_input_is_one_clear_sentence(ip, line, message):
    with pytest.raises(UsageError, match=message):
        run(ip, line)


def test_a_cluster_of_no_workers_is_refused_before_anything_starts(ip):
    """It started and could run nothing (issue 25.6); an adaptive one is let through to its backend."""
    with pytest.raises(jc.ClusterError, match=r"^--workers 0 starts a cluster that can run nothing; [^.]*\.$"):
        jc.start(workers=0, name="idle-api")
    with pytest.raises(UsageError, match="--workers 0 starts a cluster that can run nothing"):
        run(ip, "start --workers 0 --name idle-magic")
    assert registry.read("idle-api") is None and registry.read("idle-magic") is None
    assert session.handles() == [] and jc.current() is None
    # adaptive: not refused here; the local backend says itself that it does not adapt from the start
    with pytest.raises(UsageError) as info:
        run(ip, "start --workers 0 --adapt-max 2 --name idle-adapt")
    assert "can run nothing" not in str(info.value)


@pytest.mark.parametrize("limit", ["1e999GB", float("inf"), float("nan"), -1, -0.5, 2**64, "-2GiB", True, [2]])
def test_a_malformed_memory_limit_is_refused_before_anything_starts(limit):
    with pytest.raises(jc.ClusterError, match=r'^--memory-limit must be a size such as "2GiB", "auto", .*, not .*\.$'):
        jc.start(workers=1, memory_limit=limit, name="bad-limit")
    assert registry.read("bad-limit") is None and session.handles() == []


def test_unanswering_scheduler_times_out_quickly(ip, monkeypatch):
    import dask

    # A listening socket that never speaks Dask: connecting must give up, not hang.
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    try:
        with dask.config.set({"jupyter-cluster.connect-timeout": "2s"}):
            with pytest.raises(UsageError, match="no scheduler answered .* within 2 s"):
                run(ip, f"connect tcp://127.0.0.1:{port}")
    finally:
        server.close()
    assert jc.current() is None


def test_port_already_taken(ip):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    try:
        with pytest.raises(UsageError, match=f"port {port} is already taken"):
            run(ip, f"start --workers 1 --port {port}")
    finally:
        server.close()
    assert jc.current() is None and not session.handles()


def test_kubernetes_backend_without_extra_says_how_to_install(ip, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_dask_kubernetes(name, *args, **kwargs):
        if name.startswith("dask_kubernetes"):
            raise ImportError("No module named 'dask_kubernetes'")
        return real_import(name, *args, **kwargs)

    # Simulates the extra not being installed (it is installed in the test env).
    monkeypatch.setattr(builtins, "__import__", no_dask_kubernetes)
    with pytest.raises(UsageError, match=r"pip install 'jupyter-cluster\[kubernetes\]'"):
        run(ip, "start --backend kubernetes")


def test_usage_is_the_docstring(ip):
    doc = ip.find_line_magic("cluster").__doc__
    assert "%cluster connect ADDRESS|NAME" in doc and "%cluster adapt" in doc


def test_default_backend_comes_from_dask_config():
    import dask

    with dask.config.set({"jupyter-cluster.backend": "nosuch"}):
        with pytest.raises(jc.ClusterError, match="unknown backend 'nosuch'"):
            jc.start()


def _without_workers(handle):
    """``handle`` once its workers have gone: a cluster cannot be started with none (issue 25.6)."""
    handle.scale(0)
    wait_for(lambda: not handle.client.scheduler_info()["workers"], 60, message="the workers to retire")
    return handle


def test_map_on_a_cluster_without_workers_says_so_and_runs_once_scaled(capfd):
    import threading

    handle = _without_workers(jc.start(workers=1, name="empty"))
    timer = threading.Timer(7.0, handle.scale, args=(1,))
    timer.start()
    try:
        assert jc.map(abs, [-1, -2], client=handle, progress=False) == [1, 2]
    finally:
        timer.cancel()
    assert "has no workers, so the map is waiting" in capfd.readouterr().err


# -- after the scheduler died (issue 18.11) -------------------------------------------
DEAD_SCHEDULER = """
import asyncio
from distributed import Scheduler

async def main():
    async with Scheduler(host="127.0.0.1", port=0, dashboard=False) as s:
        print(s.address, flush=True)
        await asyncio.sleep(600)

asyncio.run(main())
"""


@pytest.mark.parametrize("kind", ["local", "attached"])
def test_a_dead_scheduler_is_not_listed_is_a_clear_error_and_stops_fast(ip, capsys, kind):
    import os
    import subprocess
    import sys
    import time

    import psutil

    proc = None
    if kind == "local":
        handle = run(ip, "start --workers 1 --name dies-local")
        pids = list(handle.client.run(os.getpid).values())
        handle.cluster.sync(handle.cluster.scheduler.close)  # the scheduler ends, the kernel lives on
    else:
        proc = subprocess.Popen([sys.executable, "-c", DEAD_SCHEDULER], stdout=subprocess.PIPE, text=True)
        address = proc.stdout.readline().strip()
        handle = run(ip, f"connect {address}")
        proc.kill()
        proc.wait()
    try:
        wait_for(handle.scheduler_gone, timeout=30, message="the client to notice")
        capsys.readouterr()
        run(ip, "list")
        assert handle.name not in capsys.readouterr().out
        with pytest.raises(
            UsageError, match=f"the scheduler of cluster '{handle.name}' .* has stopped or does not answer"
        ):
            ip.run_cell_magic("parallel", "x in range(3)", "x\n")
        t0 = time.monotonic()
        run(ip, "stop")
        assert time.monotonic() - t0 < 5
        if kind == "local":  # fast, and still no worker left behind
            wait_for(
                lambda: (
                    not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)
                ),
                timeout=30,
                message="the workers to exit",
            )
        assert jc.current() is None or jc.current() is not handle
    finally:
        if not handle.closed:
            handle.close()
        if proc is not None and proc.poll() is None:
            proc.kill()


def test_scale_and_adapt_beyond_the_machine_are_refused(ip):
    handle = run(ip, "start --workers 1 --no-wait --name too-many")
    try:
        with pytest.raises(UsageError, match="100000 workers is more than the local backend can run here"):
            run(ip, "scale 100000")
        with pytest.raises(UsageError, match="100000 workers is more than the local backend can run here"):
            run(ip, "adapt --minimum 0 --maximum 100000")
        assert len(handle.cluster.worker_spec) == 1
    finally:
        run(ip, "stop")


def test_usage_is_written_from_the_parser():
    """Every sub-command and option the parser takes is in `%cluster?` and in every usage error."""
    import argparse

    from IPython.core.error import UsageError

    from jupyter_cluster.magics.cluster_magic import ClusterMagics, _parser

    parser = _parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    doc = ClusterMagics.cluster.__doc__
    start_help = parser.start_parser.format_help()
    backend_flags = {"--" + name.replace("_", "-") for name in parser.start_options}
    for name, sub in commands.items():
        assert f"%cluster {name}" in doc and sub.description in doc
        for action in sub._actions:
            for flag in action.option_strings:
                if action.help is not argparse.SUPPRESS:
                    # the backends' own start flags are listed by `%cluster start --help` (the docstring is
                    # written at %load_ext, before any backend is imported)
                    assert flag in (start_help if flag in backend_flags else doc), flag
    assert "--no-wait" in doc and "metrics" in commands and "%cluster start --help" in doc
    assert {"--workers", "--partition", "--image", "--hosts", "--gpus"} <= backend_flags
    assert _parser(backend_options=False).usage_text == parser.usage_text
    with pytest.raises(UsageError) as err:
        parser.parse_args(["scale", "x"])
    assert "%cluster metrics [TOPIC]" in str(err.value)
    import os

    with open(
        os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs", "magics.md")
    ) as f:
        assert parser.usage_text in f.read(), "docs/magics.md shows an older %cluster usage; paste _parser().usage_text"


def test_cell_magic_usage_lists_every_option_their_parsers_take():
    """%%parallel and %%spmd write their usage from the same table as their parsers."""
    from jupyter_cluster.magics import parallel_magic, spmd_magic

    for module, usage in ((parallel_magic, parallel_magic.PARALLEL_USAGE), (spmd_magic, spmd_magic.SPMD_USAGE)):
        flags = [flag for action in module._parser()._actions for flag in action.option_strings]
        assert flags and all(f"  {flag}" in usage for flag in flags), (module.__name__, flags)
    import os

    with open(
        os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs", "magics.md")
    ) as f:
        docs = f.read()
    assert parallel_magic.PARALLEL_USAGE in docs and spmd_magic.SPMD_USAGE in docs, "docs/magics.md is out of date"


def _worker_view(client) -> dict:
    # eval, a builtin, is sent by name: pickling a function of this module would make the
    # worker import this module, and with it the notebook side it imports.
    code = (
        "dict(ppid=__import__('os').getppid(), env=__import__('os').environ.get('JC_TEST_SET_LATER'), "
        "omp=__import__('os').environ.get('OMP_NUM_THREADS'), modules=sorted(__import__('sys').modules))"
    )
    view = next(iter(client.run(eval, code).values()))
    modules = set(view.pop("modules"))
    view["notebook_side"] = sorted(
        modules & {"jupyter_cluster.cluster.session", "jupyter_cluster.widgets", "ipywidgets"}
    )
    return view


def test_workers_fork_from_a_server_and_get_the_notebooks_environment(monkeypatch):
    """Local workers come from the fork server (no fresh interpreter each), yet see today's environment."""
    import os

    import psutil

    from jupyter_cluster.backends import local

    first = jc.start(workers=1, name="fork-a")
    view = _worker_view(first.client)
    server = psutil.Process(view["ppid"])
    assert "forkserver" in " ".join(server.cmdline()), server.cmdline()
    assert server.ppid() == os.getpid()  # the fork server is this process's child (its process group)
    assert view["omp"] == "1"  # Dask's pre-spawn environment, as spawned workers get it
    assert view["notebook_side"] == []  # workers import only what runs on them
    assert view["env"] is None
    # A variable set after the fork server started reaches the next cluster's workers.
    monkeypatch.setenv("JC_TEST_SET_LATER", "yes")
    second = jc.start(workers=1, name="fork-b")
    later = _worker_view(second.client)
    assert later["ppid"] == view["ppid"] and later["env"] == "yes"
    assert local.environ_since_forkserver()["JC_TEST_SET_LATER"] == "yes"
    # Forked processes share their parent's memory: each must still draw its own random numbers.
    second.scale(3)
    second.wait_for_workers(3)
    for expr in ("__import__('random').random()", "__import__('numpy').random.random()"):
        draws = list(second.client.run(eval, expr).values())
        assert len(set(draws)) == 3, (expr, draws)


def test_fork_server_can_be_switched_off_and_on_again():
    import os

    import dask
    import psutil

    jc.start(workers=1, name="fork-on").close()  # the fork server runs now
    with dask.config.set({"jupyter-cluster.local.forkserver": False}):
        off = jc.start(workers=1, name="fork-off")
        assert _worker_view(off.client)["ppid"] == os.getpid()  # spawned by this process's nanny
        off.close()
    on = jc.start(workers=1, name="fork-on-again")
    assert "forkserver" in " ".join(psutil.Process(_worker_view(on.client)["ppid"]).cmdline())


def test_the_usage_is_written_at_load_ext_without_importing_a_backend():
    """``%cluster?`` is written when the magic loads: no backend module (the local one imports distributed)."""
    import json
    import subprocess
    import sys

    code = (
        "import json, sys\n"
        "from IPython.testing.globalipapp import start_ipython\n"
        "ip = start_ipython()\n"
        "ip.run_line_magic('load_ext', 'jupyter_cluster')\n"
        "doc = ip.find_line_magic('cluster').__doc__\n"
        "print(json.dumps([doc, sorted(m for m in sys.modules if m.startswith('jupyter_cluster.backends.'))]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    doc, loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert "[--OPTION ...]" in doc and "%cluster start --help" in doc
    # the fork server begun at %load_ext is in backends.local's package, but none of the backend classes' modules
    backend_modules = {
        "jupyter_cluster.backends." + m
        for m in ("local.backend", "jobqueue.backend", "ssh", "kubernetes", "gateway", "address")
    }
    assert not backend_modules & set(loaded), loaded
