"""The ssh backend against real sshd hosts: network namespaces on this machine (tests/hpc/ssh_hosts.py).

Three hosts; the first runs the scheduler, the other two a worker each; TLS
(the default) with credentials copied to the hosts.  A ``%%parallel`` cell in
a real IPython shell, a map that loses a host half-way, ``%cluster stop`` and
a kernel killed with ``kill -9`` (nothing may stay on the hosts), and logins
that must fail in one sentence.

Needs root and ``openssh-server``; skipped with the reason elsewhere, except
in CI (``CI=true``), where not being able to run is a failure.
"""

from __future__ import annotations

import glob
import os
import signal
import stat
import threading
import time

import dask
import pytest
from IPython.core.error import UsageError

from tests.conftest import wait_for
from tests.helpers import kernel_ok, start_jupyter_named_kernel, stop_jupyter_named_kernel, unique_topic
from tests.hpc import ssh_items
from tests.hpc.ssh_hosts import SSHHosts, unavailable_reason

pytestmark = [pytest.mark.netns, pytest.mark.slow]

#: how long a host may keep processes after a stop or after its notebook died (seconds)
CLEAN_WITHIN = 60


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    reason = unavailable_reason()
    if reason is not None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"the SSH tests must run in CI but cannot: {reason}")
        pytest.skip(f"SSH hosts need network namespaces and sshd: {reason}")
    h = SSHHosts(tmp_path_factory.mktemp("ssh-hosts"), 3)
    try:
        h.build()
        with dask.config.set(h.dask_config()):
            yield h
    finally:
        h.teardown()
        import subprocess

        left = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
        assert not {n for n in left if n.startswith(h.tag)}, "namespaces left behind"


def _hosts_clean(h: SSHHosts) -> bool:
    return not any(h.extra_pids(i) for i in range(len(h.addresses)))


def _remote_credentials() -> list[str]:
    return glob.glob(os.path.expanduser("~/.cache/jupyter-cluster/*.pem"))


def test_parallel_cell_on_ssh_hosts_over_tls_then_stop_leaves_nothing(ip, hosts):
    import jupyter_cluster as jc

    before = set(_remote_credentials())
    ip.run_line_magic("cluster", f"start --backend ssh --hosts {','.join(hosts.addresses)} --name ssh-cell")
    handle = jc.cluster.session.get("ssh-cell")
    try:
        assert handle.address.startswith(f"tls://{hosts.addresses[0]}:")
        # start returns once the workers' processes run; on a loaded machine one may register a moment later
        handle.client.wait_for_workers(len(hosts.addresses) - 1, timeout=60)
        workers = handle.client.scheduler_info()["workers"]
        assert sorted(w.split("//")[1].rsplit(":", 1)[0] for w in workers) == hosts.addresses[1:]
        # the credentials on the hosts: this user's only
        shipped = sorted(set(_remote_credentials()) - before)
        assert len(shipped) == 1
        assert stat.S_IMODE(os.stat(shipped[0]).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(os.path.dirname(shipped[0])).st_mode) == 0o700
        topic = unique_topic("ssh")
        ip.user_ns["SSH_TOPIC"] = topic
        ip.run_cell_magic(
            "parallel",
            "i in range(12) --out ssh_results --no-progress",
            "import jupyter_cluster as jc\njc.report(step=i, topic=SSH_TOPIC, value=float(i * i))\n(i, i * i)",
        )
        assert ip.user_ns["ssh_results"] == [(i, i * i) for i in range(12)]
        # report() from the hosts' workers reaches the notebook (over the cluster's TLS)
        rows = jc.metrics(topic)
        rows = rows.to_dict("records") if hasattr(rows, "to_dict") else rows
        assert sorted((int(r["step"]), r["value"]) for r in rows) == [(i, float(i * i)) for i in range(12)]
        with jc.Pool(cluster=handle) as pool:  # multiprocessing's API on the hosts
            assert pool.map(abs, [-1, -2, -3]) == [1, 2, 3]
        # scale adds workers round-robin on the worker hosts (SSHCluster itself has no worker template)
        ip.run_line_magic("cluster", "scale 3")
        handle.wait_for_workers(3, timeout=120)
        placed = sorted(w.split("//")[1].rsplit(":", 1)[0] for w in handle.client.scheduler_info()["workers"])
        assert len(placed) == 3 and set(placed) == set(hosts.addresses[1:]), placed
    finally:
        ip.run_line_magic("cluster", "stop ssh-cell")
    wait_for(lambda: _hosts_clean(hosts), CLEAN_WITHIN, message="every SSH-started process to leave the hosts")
    assert not (set(_remote_credentials()) - before), "credentials left on the hosts"


def test_map_survives_losing_a_worker_host(hosts, tmp_path):
    import cloudpickle

    import jupyter_cluster as jc

    cloudpickle.register_pickle_by_value(ssh_items)
    handle = jc.start(backend="ssh", hosts=hosts.addresses, workers=2, name="ssh-lost")
    try:
        folder = str(tmp_path)
        os.chmod(folder, 0o777)
        out: dict = {}

        def run() -> None:
            try:
                out["results"] = jc.map(ssh_items.slow_item, [folder] * 16, range(16), client=handle)
            except BaseException as exc:  # reported below
                out["error"] = exc

        mapper = threading.Thread(target=run)
        mapper.start()
        victim = hosts.addresses[2]
        wait_for(
            lambda: "error" in out or glob.glob(os.path.join(folder, f"*-{victim}")),
            120,
            message="an item to start on the victim host",
        )
        assert "error" not in out, out.get("error")
        hosts.kill_host(2)  # the whole host: sshd, the nanny, the worker
        open(os.path.join(folder, "go"), "w").close()
        mapper.join(180)
        assert not mapper.is_alive(), "the map did not finish after a host was lost"
        assert "error" not in out, out.get("error")
        results = out["results"]
        assert [r[:2] for r in results] == [(i, i * i) for i in range(16)]  # each once, in order
        assert {r[2] for r in results[4:]} <= set(hosts.addresses[1:])
    finally:
        cloudpickle.unregister_pickle_by_value(ssh_items)
        handle.stop()
        hosts.start_sshd(2)  # the host comes back for the next tests
        hosts.wait_for_port(victim, 22)
    wait_for(lambda: _hosts_clean(hosts), CLEAN_WITHIN, message="every SSH-started process to leave the hosts")


def test_stop_button_during_start_then_kernel_killed_leave_no_process_on_the_hosts(hosts, tmp_path):
    """The stop button while ``%cluster start`` starts the remote processes left them running, listed
    nowhere, until the kernel exited (issue 37.4); ``kill -9`` of the kernel must leave nothing either,
    except a kept cluster (``--keep``, issue 35), which stops itself once idle."""
    import psutil

    import jupyter_cluster as jc
    from jupyter_cluster.state import registry
    from tests.helpers import kernel_execute

    km, kc, _ = start_jupyter_named_kernel(tmp_path)
    try:
        settings = hosts.dask_config()
        kernel_ok(kc, f"import dask; dask.config.set({settings!r})\n%load_ext jupyter_cluster")
        replies: dict = {}
        start = threading.Thread(
            target=lambda: replies.update(
                r=kernel_execute(
                    kc,
                    f"%cluster start --backend ssh --hosts {hosts.addresses[0]},{hosts.addresses[1]} "
                    "--name ssh-int --no-tls",
                    timeout=180,
                )
            )
        )
        start.start()
        # the stop button once the scheduler's process runs on its host, while the workers start
        wait_for(
            lambda: any("dask_spec" in c for c in hosts.commands(0)), 120, interval=0.05, message="the remote scheduler"
        )
        km.interrupt_kernel()
        start.join(120)
        assert not start.is_alive()
        status, out = replies["r"]
        if status == "ok":  # a very slow machine: the start ended before the interrupt came; then it is listed
            assert "ssh-int" in kernel_ok(kc, "%cluster list")
            kernel_ok(kc, "%cluster stop ssh-int", timeout=120)
        else:
            assert "KeyboardInterrupt" in out, out
        t0 = time.monotonic()
        wait_for(
            lambda: _hosts_clean(hosts),
            CLEAN_WITHIN,
            message=f"the hosts to drop an interrupted start's processes: {hosts.commands(0)} {hosts.commands(1)}",
        )
        print(f"interrupted start: hosts clean {time.monotonic() - t0:.1f} s after the interrupt")
        listed = kernel_ok(kc, "%cluster list")
        assert "ssh-int" not in listed, listed
        kernel_ok(
            kc,
            # without TLS here: the plain-TCP path is covered too
            f"%cluster start --backend ssh --hosts {hosts.addresses[0]},{hosts.addresses[1]} --name ssh-kill9 --no-tls",
            timeout=180,
        )
        out = kernel_ok(
            kc, "import jupyter_cluster as jc; print(jc.cluster.session.get().address, jc.map(abs, [-1, -2]))"
        )
        assert f"tcp://{hosts.addresses[0]}:" in out and "[1, 2]" in out, out
        assert hosts.extra_pids(0) and hosts.extra_pids(1)
        # issue 35: a kept cluster on the third host (scheduler and worker there, TLS) from the same kernel,
        # set up through the kernel's dask.config.set above: it must outlive the kill -9, then idle out
        creds_before = set(_remote_credentials())
        third = hosts.addresses[2]
        out = kernel_ok(
            kc,
            f"%cluster start --backend ssh --hosts {third},{third} --name ssh-kept --keep --idle-timeout 20s",
            timeout=240,
        )
        assert "Started kept cluster 'ssh-kept'" in out, out
        kept_host = registry.read("ssh-kept").owner_pid
        out = kernel_ok(kc, "print(jc.map(abs, [-5, -6]))")
        assert "[5, 6]" in out, out
        assert hosts.extra_pids(2) and set(_remote_credentials()) - creds_before
        os.kill(km.provisioner.process.pid, signal.SIGKILL)
        wait_for(
            lambda: not hosts.extra_pids(0) and not hosts.extra_pids(1),
            CLEAN_WITHIN,
            message="the hosts to drop a dead kernel's processes",
        )
        # the kept cluster is still there, and works from another process
        assert hosts.extra_pids(2) and psutil.pid_exists(kept_host)
        handle = jc.connect("ssh-kept")
        try:
            assert handle.client.submit(pow, 2, 5).result(timeout=60) == 32
        finally:
            handle.close()
        # nothing attached, nothing running: it stops itself, its remote processes and credentials with it
        wait_for(lambda: not psutil.pid_exists(kept_host), 90, message="the idle kept SSH cluster's host to end")
        wait_for(lambda: not hosts.extra_pids(2), CLEAN_WITHIN, message="the kept cluster's remote processes to go")
        assert registry.read("ssh-kept") is None
        assert not (set(_remote_credentials()) - creds_before), "credentials left on the hosts"
    finally:
        stop_jupyter_named_kernel(km, kc)
        rec = registry.read("ssh-kept")
        if rec is not None and psutil.pid_exists(rec.owner_pid):
            os.kill(rec.owner_pid, signal.SIGTERM)


def test_workers_that_write_megabytes_to_stderr_do_not_block(hosts):
    """Dask reads a remote process's output only until it started; the rest must be read too."""
    import cloudpickle

    import jupyter_cluster as jc

    cloudpickle.register_pickle_by_value(ssh_items)
    handle = jc.start(backend="ssh", hosts=hosts.addresses[:2], name="ssh-noisy")
    try:
        out: dict = {}
        mapper = threading.Thread(
            target=lambda: out.update(r=jc.map(ssh_items.noisy_item, range(24), client=handle, progress=False))
        )
        mapper.start()  # 12 MiB through one SSH channel
        mapper.join(120)
        assert not mapper.is_alive(), "the worker blocked writing to its SSH session"
        assert out["r"] == list(range(24))
    finally:
        cloudpickle.unregister_pickle_by_value(ssh_items)
        handle.stop()
    wait_for(lambda: _hosts_clean(hosts), CLEAN_WITHIN, message="every SSH-started process to leave the hosts")


def test_stop_after_the_scheduler_host_died_leaves_nothing_on_the_others(hosts):
    import jupyter_cluster as jc

    handle = jc.start(backend="ssh", hosts=hosts.addresses[:2], name="ssh-headless")
    try:
        assert hosts.extra_pids(1)
        hosts.kill_host(0)  # the scheduler's host: sshd and the scheduler
        wait_for(handle.scheduler_gone, 120, message="the client to notice the scheduler is gone")
    finally:
        handle.stop()
        hosts.start_sshd(0)
        hosts.wait_for_port(hosts.addresses[0], 22)
    wait_for(lambda: _hosts_clean(hosts), CLEAN_WITHIN, message="the worker host to drop its processes")


@pytest.mark.parametrize("case", ["wrong key", "unknown host", "refused", "no python"])
def test_bad_login_refused_in_one_sentence(ip, hosts, tmp_path, case):
    import jupyter_cluster as jc

    settings: dict = {}
    expected = {
        "wrong key": "was refused",
        "unknown host": "not trusted",
        "refused": "refused the SSH connection",
        "no python": "cannot run Dask workers with /nonexistent/python",
    }
    if case == "wrong key":
        settings = hosts.dask_config(key=hosts.wrong_key)
    elif case == "unknown host":
        empty = tmp_path / "known_hosts"
        empty.write_text("")
        settings = {"jupyter-cluster.ssh.known-hosts": str(empty)}
    elif case == "refused":
        settings = {"jupyter-cluster.ssh.port": 1}
    else:
        settings = {"jupyter-cluster.ssh.remote-python": "/nonexistent/python"}
    before = set(_remote_credentials())
    started = time.monotonic()
    with dask.config.set(settings), pytest.raises(UsageError) as info:
        ip.run_line_magic("cluster", f"start --backend ssh --hosts {hosts.addresses[0]},{hosts.addresses[1]}")
    message = str(info.value)
    assert expected[case] in message, message
    assert "\n" not in message and message.endswith(".") and message.count(". ") == 0, message
    assert time.monotonic() - started < 60
    assert not (set(_remote_credentials()) - before)
    assert jc.cluster.session.current() is None or not jc.cluster.session.current().backend == "ssh"
    # sshd's pre-authentication child may take a moment to go; nothing of Dask ever started
    wait_for(lambda: _hosts_clean(hosts), CLEAN_WITHIN, message="the refused logins' sshd children to end")


def test_spmd_cell_on_ssh_hosts(ip, hosts):
    """%%spmd (gloo) in a real IPython shell on the SSH hosts' workers: every rank's all_reduce result, one
    rank per worker host."""
    pytest.importorskip("torch")
    import jupyter_cluster as jc

    ip.run_line_magic("cluster", f"start --backend ssh --hosts {','.join(hosts.addresses)} --name ssh-spmd")
    handle = jc.cluster.session.get("ssh-spmd")
    try:
        handle.wait_for_workers(2, timeout=120)
        res = ip.run_cell(
            "%%spmd --out ssh_total\nimport torch, torch.distributed as dist\n"
            "t = torch.ones(1) * (dist.get_rank() + 1)\ndist.all_reduce(t)\n"
            "(dist.get_backend(), t.item(), dist.get_world_size())\n"
        )
        assert res.error_in_exec is None, res.error_in_exec
        assert ip.user_ns["ssh_total"] == {0: ("gloo", 3.0, 2), 1: ("gloo", 3.0, 2)}, ip.user_ns["ssh_total"]
    finally:
        ip.run_line_magic("cluster", "stop ssh-spmd")
    wait_for(lambda: _hosts_clean(hosts), CLEAN_WITHIN, message="every SSH-started process to leave the hosts")
