"""The cluster registry: records, liveness of owners, cleanup."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from jupyter_cluster.state import registry


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


# -- records are not trusted on read (issue 18.6) ---------------------------------------
def test_an_existing_open_registry_folder_is_tightened(tmp_path):
    import dask

    folder = tmp_path / "open"
    folder.mkdir()
    os.chmod(folder, 0o777)
    with dask.config.set({"jupyter-cluster.registry-dir": str(folder)}):
        registry.registry_dir()
    assert oct(os.stat(folder).st_mode & 0o777) == "0o700"


def test_a_registry_folder_of_another_user_is_refused(tmp_path):
    import dask
    import pytest

    from jupyter_cluster.errors import ClusterError

    if os.geteuid() != 0:
        pytest.skip("needs root to make a folder owned by another user")
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o700)
    os.chown(folder, 65534, 65534)
    with dask.config.set({"jupyter-cluster.registry-dir": str(folder)}):
        with pytest.raises(ClusterError, match="not a folder of this user"):
            registry.registry_dir()


def test_a_record_naming_a_path_outside_the_folder_is_ignored_and_nothing_outside_is_deleted(tmp_path):
    import dask

    folder = tmp_path / "reg"
    victim = tmp_path / "victim.json"
    victim.write_text("{}")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with dask.config.set({"jupyter-cluster.registry-dir": str(folder)}):
        d = registry.registry_dir()
        with open(os.path.join(d, "planted.json"), "w") as f:
            json.dump(
                {
                    "name": "../victim",
                    "backend": "local",
                    "address": "tcp://127.0.0.1:1",
                    "owner_pid": dead.pid,
                    "owner_started": 1.0,
                },
                f,
            )
        assert registry.live_records() == []
        import pytest

        from jupyter_cluster.errors import ClusterError

        with pytest.raises(ClusterError, match="not a valid cluster name"):
            registry.remove("../victim")
    assert victim.exists()


def test_a_fresh_process_runs_the_dead_owners_backend_clean_up_without_having_imported_it(tmp_path):
    """The registry imports no backend: a new process (a new kernel, the panel's server) that finds a dead
    batch cluster's record still cancels its jobs and deletes what they were given (issue 28)."""
    jobs = tmp_path / "jobs"
    given = jobs / "jc-dead-0a1b2c"
    given.mkdir(parents=True)
    (given / "cluster.pem").write_text("credentials the jobs were given")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    env = dict(
        os.environ,
        DASK_JUPYTER_CLUSTER__REGISTRY_DIR=str(tmp_path / "reg"),
        DASK_JUPYTER_CLUSTER__JOBQUEUE__SHARED_DIRECTORY=str(jobs),
    )
    extra = {"batch": {"system": "slurm", "job_name": given.name}}
    code = f"""
import json, os, sys
from jupyter_cluster.state import registry
rec = registry.ClusterRecord(name="hpc-dead", backend="slurm", address="tcp://127.0.0.1:7", owner_pid={dead.pid},
                             extra={extra!r})
registry.write(rec)
before = sorted(m for m in sys.modules if m.startswith("jupyter_cluster.backends."))
print(json.dumps([before, [r.name for r in registry.live_records()], os.listdir(registry.registry_dir())]))
"""
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    backends_before, live, left = json.loads(out.stdout.strip().splitlines()[-1])
    assert backends_before == [] and live == [] and left == []
    assert not given.exists() and jobs.exists()


def test_a_record_names_a_backend_not_code_to_run(tmp_path):
    import dask

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with dask.config.set({"jupyter-cluster.registry-dir": str(tmp_path / "reg3")}):
        d = registry.registry_dir()
        for name, backend in [("a", "os:system"), ("b", ["slurm"]), ("c", "no-such-backend")]:
            with open(os.path.join(d, f"{name}.json"), "w") as f:
                json.dump({"name": name, "backend": backend, "address": "x", "owner_pid": dead.pid, "extra": {}}, f)
        assert registry.live_records() == [] and os.listdir(d) == []


def test_records_that_are_links_or_belong_to_another_user_are_ignored(tmp_path):
    import dask

    folder = tmp_path / "reg2"
    with dask.config.set({"jupyter-cluster.registry-dir": str(folder)}):
        d = registry.registry_dir()
        real = registry.ClusterRecord(name="real", backend="local", address="tcp://127.0.0.1:5")
        registry.write(real)
        os.symlink(os.path.join(d, "real.json"), os.path.join(d, "linked.json"))
        names = {r.name for r in registry.live_records()}
        assert names == {"real"}
        if os.geteuid() == 0:
            registry.write(registry.ClusterRecord(name="foreign", backend="local", address="tcp://127.0.0.1:6"))
            os.chown(os.path.join(d, "foreign.json"), 65534, 65534)
            assert {r.name for r in registry.live_records()} == {"real"}


def test_the_panel_never_signals_a_process_a_record_merely_names(tmp_path):
    """A planted "panel" record naming an unrelated live process: DELETE must not kill it."""
    import asyncio

    import dask
    import pytest

    from jupyter_cluster.errors import ClusterError
    from jupyter_cluster.server.manager import ClusterManager

    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        with dask.config.set({"jupyter-cluster.registry-dir": str(tmp_path / "reg3")}):
            rec = registry.ClusterRecord(
                name="planted",
                backend="local",
                address="tcp://127.0.0.1:1",
                owner_pid=bystander.pid,
                owner_kind="panel",
            )
            assert rec.owner_alive() and not rec.owner_is_panel_host()
            registry.write(rec)

            async def stop():
                manager = ClusterManager()
                try:
                    await manager.refresh()
                    await manager.stop("planted", timeout=2)
                finally:
                    await manager.close()

            with pytest.raises(ClusterError):
                asyncio.run(stop())
        assert bystander.poll() is None, "the bystander process was signalled"
    finally:
        bystander.kill()
        bystander.wait()


def test_a_record_written_in_a_kernel_names_that_kernel_and_others_name_none(tmp_path):
    """The panel follows the active notebook to its cluster through the record's kernel id.

    A real kernel started as a Jupyter server starts one (connection file
    ``kernel-<id>.json``) writes a record as ``session`` does, without naming
    itself; the record carries the id.  This process, no kernel, writes None.
    """

    from ..helpers import start_jupyter_named_kernel

    km, kc, kernel_id = start_jupyter_named_kernel(tmp_path)
    try:
        out: list[str] = []
        code = (
            "from jupyter_cluster.state import registry\n"
            "registry.write(registry.ClusterRecord(name='in-kernel', backend='local', address='tcp://127.0.0.1:9'))\n"
            "print('written', registry.current_kernel_id())"
        )
        reply = kc.execute_interactive(
            code,
            timeout=60,
            output_hook=lambda m: out.append(m["content"].get("text", "")) if m["msg_type"] == "stream" else None,
        )
        assert reply["content"]["status"] == "ok", out
        assert "".join(out).split() == ["written", kernel_id]
        rec = registry.read("in-kernel")
        assert rec is not None and rec.owner_pid != os.getpid()
        assert rec.kernel_id == kernel_id
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        registry.remove("in-kernel")
    assert registry.current_kernel_id() is None
    registry.write(registry.ClusterRecord(name="no-kernel", backend="local", address="tcp://127.0.0.1:9"))
    try:
        assert registry.read("no-kernel").kernel_id is None
    finally:
        registry.remove("no-kernel")


def test_a_kernel_id_that_could_not_name_a_connection_file_is_dropped():
    rec = registry.ClusterRecord(name="odd-id", backend="local", address="tcp://127.0.0.1:1", kernel_id="../../x y")
    registry.write(rec)
    try:
        assert registry.read("odd-id").kernel_id is None
    finally:
        registry.remove("odd-id")


# -- attachments: a process attached by name to a cluster it does not own -------------------
def test_an_attachment_is_listed_while_its_process_runs_and_removed_after():
    written = registry.write_attachment("att-a", "tcp://127.0.0.1:11")
    try:
        (got,) = [a for a in registry.live_attachments() if a.name == "att-a"]
        assert got == written and got.owner_pid == os.getpid() and got.kernel_id is None  # no kernel here
        assert "att-a" not in {r.name for r in registry.live_records()}  # not a cluster of its own
    finally:
        registry.remove_attachment("att-a")
    assert "att-a" not in {a.name for a in registry.live_attachments()}
    registry.remove_attachment("att-a")  # removing twice is harmless


def test_attachments_of_dead_processes_are_dropped_and_planted_ones_ignored(tmp_path):
    import dask

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    victim = tmp_path / "victim.attached"
    victim.write_text("{}")
    with dask.config.set({"jupyter-cluster.registry-dir": str(tmp_path / "reg4")}):
        d = registry.registry_dir()
        stale = registry.Attachment(name="att-b", address="tcp://127.0.0.1:12", owner_pid=dead.pid, kernel_id="k1")
        with open(os.path.join(d, f"att-b@{dead.pid}.attached"), "w") as f:
            json.dump(stale.__dict__, f)
        # a file whose name is not its content's (a live owner, so it would be listed were it trusted)
        planted = registry.Attachment(name="../victim", address="tcp://127.0.0.1:13", kernel_id="k2")
        with open(os.path.join(d, "other@1.attached"), "w") as f:
            json.dump(planted.__dict__, f)
        assert registry.live_attachments() == []
        assert sorted(os.listdir(d)) == ["other@1.attached"]  # the dead one's file went, the planted one stays
    assert victim.exists()


def test_a_kernel_that_connects_by_name_is_attached_until_it_detaches_or_dies(tmp_path):
    """``%cluster connect NAME`` in a real kernel: an attachment naming the kernel, gone on stop and on kill."""

    from ..helpers import kernel_ok, start_jupyter_named_kernel, stop_jupyter_named_kernel
    from ..server.test_server import start_kernel_like

    owner = start_kernel_like("att-owner")
    km, kc, kernel_id = start_jupyter_named_kernel(tmp_path)
    try:
        kernel_ok(kc, "%load_ext jupyter_cluster\n%cluster connect att-owner")
        (att,) = registry.live_attachments()
        assert (att.name, att.kernel_id) == ("att-owner", kernel_id)
        assert att.address == registry.read("att-owner").address and att.owner_pid != os.getpid()
        kernel_ok(kc, "%cluster stop att-owner")  # detaches; the cluster is its owner's and runs on
        assert registry.live_attachments() == [] and registry.read("att-owner") is not None
        kernel_ok(kc, "%cluster connect att-owner")
        assert [a.kernel_id for a in registry.live_attachments()] == [kernel_id]
        km.shutdown_kernel(now=True)  # killed: nothing runs its exit hooks
        assert registry.live_attachments() == []
        assert [f for f in os.listdir(registry.registry_dir()) if f.endswith(".attached")] == []
    finally:
        stop_jupyter_named_kernel(km, kc)
        owner.kill()
        owner.wait(10)
