"""The cluster registry: records, liveness of owners, cleanup."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from jupyter_cluster import registry


def test_write_read_remove_roundtrip():
    rec = registry.ClusterRecord(name="r1", backend="local", address="tcp://127.0.0.1:1")
    registry.write(rec)
    got = registry.read("r1")
    assert got == rec and got.owner_pid == os.getpid() and got.owner_alive()
    registry.remove("r1")
    assert registry.read("r1") is None
    registry.remove("r1")  # removing twice is harmless


def test_records_of_dead_owners_are_not_live_and_are_cleaned_up():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    rec = registry.ClusterRecord(name="orphan", backend="local", address="tcp://127.0.0.1:2", owner_pid=child.pid)
    assert rec.owner_started == 0.0  # the process is gone already
    registry.write(rec)
    assert "orphan" not in {r.name for r in registry.live_records()}
    assert not os.path.exists(os.path.join(registry.registry_dir(), "orphan.json"))


def test_recycled_pid_is_not_mistaken_for_the_owner():
    rec = registry.ClusterRecord(name="recycled", backend="local", address="tcp://127.0.0.1:3")
    rec.owner_started -= 1000  # same pid, different process start time
    registry.write(rec)
    assert registry.read("recycled") is None


def test_foreign_and_half_written_files_are_ignored():
    d = registry.registry_dir()
    with open(os.path.join(d, "broken.json"), "w") as f:
        f.write("{not json")
    with open(os.path.join(d, "other.json"), "w") as f:
        json.dump({"unexpected": 1}, f)
    registry.write(registry.ClusterRecord(name="fine", backend="address", address="tcp://127.0.0.1:4"))
    names = {r.name for r in registry.live_records()}
    assert "fine" in names and "broken" not in names
    registry.remove("fine")


def test_registry_dir_follows_config(tmp_path):
    import dask

    with dask.config.set({"jupyter-cluster.registry-dir": str(tmp_path / "reg")}):
        assert registry.registry_dir() == str(tmp_path / "reg")
        assert oct(os.stat(tmp_path / "reg").st_mode & 0o777) == "0o700"
