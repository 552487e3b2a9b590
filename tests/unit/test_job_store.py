"""The detached jobs' results store: whole records only, cut tails, a full disk, the size bound."""

from __future__ import annotations

import errno
import os

import dask.config
import pytest

from jupyter_cluster.errors import ClusterError
from jupyter_cluster.state import job_store


@pytest.fixture
def store(tmp_path):
    with dask.config.set({"jupyter-cluster.detached.store-dir": str(tmp_path / "jobs")}):
        yield str(tmp_path / "jobs")


def _job(name: str, state: str = "running") -> str:
    job_store.create(name, b"spec", {"name": name, "state": state})
    return os.path.join(job_store.job_dir(name), job_store.RESULTS)


def test_records_are_read_back_whole_and_a_cut_tail_is_dropped_then_overwritten(store):
    path = _job("j")
    w = job_store.ResultWriter("j")
    w.add(0, {"a": 1})
    w.add(2, ValueError("bad"), error=True)
    w.add(1, "x" * 1000)
    w.close()
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert oct(os.stat(job_store.job_dir("j")).st_mode & 0o777) == "0o700"
    size = os.path.getsize(path)
    os.truncate(path, size - 10)  # a writer killed -9 in the middle of its last record
    got = job_store.read_results("j")
    assert sorted(got) == [0, 2] and got[0] == (job_store.KIND_RESULT, {"a": 1})
    assert got[2][0] == job_store.KIND_ERROR and isinstance(got[2][1], ValueError)
    w = job_store.ResultWriter("j")  # a resumed job: the cut record goes before anything is added
    w.add(1, "again")
    w.close()
    assert job_store.read_results("j")[1] == (job_store.KIND_RESULT, "again")
    assert job_store.done_indices("j") == {0: 0, 2: 1, 1: 0}


def test_a_corrupt_record_ends_what_is_read(store):
    path = _job("c")
    w = job_store.ResultWriter("c")
    w.add(0, 1)
    w.add(1, 2)
    w.close()
    data = bytearray(open(path, "rb").read())
    data[-1] ^= 0xFF  # the last payload byte: its checksum no longer matches
    open(path, "wb").write(bytes(data))
    assert job_store.read_results("c") == {0: (0, 1)}


def test_a_full_disk_raises_enospc_and_leaves_no_partial_record(store):
    path = _job("full")
    w = job_store.ResultWriter("full")
    w.add(0, 1)
    good = os.path.getsize(path)
    full = os.open("/dev/full", os.O_WRONLY)
    saved = w._fd
    w._fd = full  # every write now fails as on a full disk
    with pytest.raises(OSError) as info:
        w.add(1, 2)
    assert info.value.errno == errno.ENOSPC and job_store.disk_full(info.value)
    os.close(full)
    w._fd = saved
    w.close()
    assert os.path.getsize(path) == good and job_store.read_results("full") == {0: (0, 1)}


def test_names_are_checked_and_a_name_in_use_is_refused(store):
    _job("once")
    with pytest.raises(ClusterError, match="already exists"):
        _job("once")
    with pytest.raises(ClusterError, match="not a valid job name"):
        job_store.job_dir("../escape")


def test_the_store_bound_evicts_the_oldest_ended_jobs_and_says_so(store):
    for name, state in (("old", "finished"), ("running", "running"), ("new", "finished")):
        _job(name, state)
        w = job_store.ResultWriter(name)
        w.add(0, b"x" * 4000)
        w.close()
    with dask.config.set({"jupyter-cluster.detached.store-limit": "9kB"}):
        assert job_store.evict_over_limit(keep="new") == ["old"]
    meta = job_store.read_meta("old")
    assert meta["state"] == "evicted" and "oldest first" in meta["reason"]
    assert job_store.read_results("old") == {} and job_store.read_results("running")


def test_results_expire_after_the_ttl_and_say_so(store):
    import time

    for name, state, ended in (("stale", "finished", time.time() - 3 * 86400), ("fresh", "finished", time.time()),
                               ("busy", "running", None)):  # fmt: skip
        _job(name, state)
        job_store.update_meta(name, ended=ended)
        w = job_store.ResultWriter(name)
        w.add(0, b"x")
        w.close()
    with dask.config.set({"jupyter-cluster.detached.result-ttl": "2d"}):
        assert job_store.evict_expired() == ["stale"]
    meta = job_store.read_meta("stale")
    assert meta["state"] == "evicted" and "expired 2 days after the job ended" in meta["reason"]
    assert job_store.read_results("stale") == {} and job_store.read_results("fresh") and job_store.read_results("busy")
    with dask.config.set({"jupyter-cluster.detached.result-ttl": 0}):
        assert job_store.evict_expired(now=time.time() + 1e9) == []


def test_requests_are_taken_once_in_order(store):
    job_store.post("c1", "a", "run")
    job_store.post("c1", "a", "cancel")
    job_store.post("c2", "b", "run")
    assert job_store.take_requests("c1") == [("a", "run"), ("a", "cancel")]
    assert job_store.take_requests("c1") == []
    assert job_store.take_requests("c2") == [("b", "run")]


@pytest.mark.skipif(os.geteuid() != 0, reason="making a folder another user's needs root")
def test_another_users_store_is_refused(tmp_path):
    path = tmp_path / "theirs"
    path.mkdir(mode=0o700)
    os.chown(path, 65534, 65534)
    with dask.config.set({"jupyter-cluster.detached.store-dir": str(path)}):
        with pytest.raises(ClusterError, match="is not a folder of this user"):
            job_store.names()


def test_a_store_others_could_read_is_tightened(store):
    os.makedirs(store, mode=0o755)
    os.chmod(store, 0o755)
    job_store.names()
    assert os.stat(store).st_mode & 0o077 == 0
