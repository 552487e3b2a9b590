"""A kept cluster's host: idle shutdown, and a host killed mid-job whose job resumes elsewhere."""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest

import jupyter_cluster as jc
from jupyter_cluster.errors import ClusterError, SerializationError
from jupyter_cluster.state import registry

from ..conftest import wait_for

pytestmark = pytest.mark.slow


def slow_square(x, seconds=1.0):
    time.sleep(seconds)
    return x * x


def counted(folder, x):
    """Each run of item ``x`` adds a byte to ``folder/x``: how many times it ran."""
    with open(os.path.join(folder, str(x)), "a") as f:
        f.write("1")
    time.sleep(0.3)
    return x * 10


def _files_of(name: str) -> list[str]:
    """The cluster's record, credentials and attachments (not its final word, left for the server's history)."""
    return [
        e
        for e in os.listdir(registry.registry_dir())
        if (e.startswith(name + ".") or e.startswith(name + "@")) and not e.endswith(registry.FINAL)
    ]


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_idle_cluster_stops_itself_but_not_while_a_job_runs(private_store):
    handle = jc.start(keep=True, workers=1, idle_timeout="3s", name="idle-k")
    record = registry.read("idle-k")
    assert record is not None and record.extra["kept"] and record.extra["idle_timeout"] == 3
    host = record.owner_pid
    workers = list(handle.client.run(os.getpid).values())
    assert _files_of("idle-k")  # its record and TLS credentials
    job = jc.submit(slow_square, range(5), name="busy", cluster=handle, chunksize=1)
    handle.close()  # only this process's attachment goes: the job keeps the cluster busy
    time.sleep(4)  # past the idle timeout, while the 5 x 1 s job runs
    assert registry.read("idle-k") is not None and not _gone(host), "a kept cluster with a running job idled out"
    assert job.result(timeout=60) == [x * x for x in range(5)]
    wait_for(lambda: _gone(host) and registry.read("idle-k") is None, 60, message="the idle cluster to stop")
    wait_for(lambda: all(_gone(p) for p in workers), 30, message="its workers to end")
    assert _files_of("idle-k") == []  # record, credentials, attachments
    assert sorted(os.listdir(private_store)) == [".inbox", "busy"]  # no host log, and ...
    assert os.listdir(os.path.join(private_store, ".inbox")) == []  # ... no inbox of the stopped cluster
    assert jc.job("busy").result() == [x * x for x in range(5)]  # the results outlive the cluster
    assert jc.job("busy").status == "finished"


def test_host_killed_mid_job_keeps_results_and_resume_runs_only_the_rest(tmp_path, private_store, ip):
    runs = tmp_path / "runs"
    runs.mkdir()
    n = 16
    a = jc.start(keep=True, workers=2, idle_timeout=0, name="kill-a")
    b = None
    try:
        job = jc.submit(counted, [str(runs)] * n, range(n), name="resumable", cluster=a, chunksize=1)
        wait_for(lambda: job.progress[0] >= 4, 60, message="four results")
        host = registry.read("kill-a").owner_pid
        os.kill(host, signal.SIGKILL)
        wait_for(lambda: job.status == "lost", 30, message="the job to be seen lost")
        before = job.partial()
        assert 4 <= len(before) < n and all(before[i] == i * 10 for i in before)
        with pytest.raises(
            ClusterError, match=r"is lost \(the host process .* died while it ran\) .*resume\(\) runs the rest"
        ):
            job.result()
        a.close()  # this process's hold on the dead cluster
        b = jc.start(keep=True, workers=2, idle_timeout=0, name="kill-b")
        job.resume(cluster=b)
        assert job.result(timeout=120) == [x * 10 for x in range(n)]
        counts = {int(f): len((runs / f).read_text()) for f in os.listdir(runs)}
        assert set(counts) == set(range(n))
        assert all(counts[i] == 1 for i in before), counts  # a finished item never runs again
        assert all(c <= 2 for c in counts.values()), counts  # at most the ones running at the kill, twice

        # bad input, each one sentence, before anything starts
        with pytest.raises(ClusterError, match="already exists"):
            jc.submit(counted, [str(runs)], [0], name="resumable", cluster=b)
        with pytest.raises(ClusterError, match=r"no detached job named 'nope' \(known: resumable\)"):
            jc.job("nope")
        lock = threading.Lock()
        with pytest.raises(SerializationError, match="cannot be handed"):
            jc.submit(lambda x: (lock, x), [1], name="unpicklable", cluster=b)
        assert not os.path.exists(os.path.join(private_store, "unpicklable"))
        from IPython.core.error import UsageError

        ip.user_ns["held"] = lock  # a captured name that cannot travel: said before anything starts
        with pytest.raises(UsageError, match="held"):
            ip.run_cell_magic("parallel", "x in range(3) --detach locked", "held\nx")
        assert not os.path.exists(os.path.join(private_store, "locked"))
        by_address = jc.connect(b.address)  # the same scheduler, but not held as a kept cluster
        try:
            with pytest.raises(UsageError, match="is not kept.* --keep"):
                ip.run_cell_magic("parallel", "x in range(3) --detach plain", "x")
        finally:
            by_address.close()
    finally:
        for h in (a, b):
            if h is not None and not h.closed:
                h.close()
        if registry.read("kill-b") is not None:
            jc.stop("kill-b")


def test_detach_needs_a_kept_cluster(ip):
    from IPython.core.error import UsageError

    assert jc.current() is None
    with pytest.raises(UsageError, match="needs a kept cluster .* --keep"):
        ip.run_cell_magic("parallel", "x in range(3) --detach nowhere", "x")
    assert jc.current() is None  # nothing was started for it


def big(x):
    return bytes([x]) * 40_000


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs (a disk that fills up) needs root")
def test_a_full_disk_fails_the_job_with_that_reason_and_keeps_whole_results(tmp_path, monkeypatch):
    import subprocess

    import dask.config

    disk = tmp_path / "small-disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", str(disk)])
    if mounted.returncode != 0:
        pytest.skip("no tmpfs mount here")
    store = str(disk / "jobs")
    try:
        with dask.config.set({"jupyter-cluster.detached.store-dir": store}):
            monkeypatch.setenv("DASK_JUPYTER_CLUSTER__DETACHED__STORE_DIR", store)  # the host's store too
            handle = jc.start(keep=True, workers=1, idle_timeout=0, name="full-k")
            try:
                job = jc.submit(big, range(12), name="fills", cluster=handle, chunksize=1)
                assert job.wait(60) == "failed"
                assert "the disk is full" in job.meta["reason"], job.meta
                with pytest.raises(ClusterError, match="failed .*the disk is full"):
                    job.result()
                kept = job.partial()
                assert 1 <= len(kept) < 12 and all(kept[i] == bytes([i]) * 40_000 for i in kept)
            finally:
                handle.close()
                jc.stop("full-k")
    finally:
        subprocess.run(["umount", "-l", str(disk)])
