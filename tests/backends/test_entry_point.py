"""A backend another package registers under the ``jupyter_cluster.backends`` entry-point group.

The package is real: a module and its ``.dist-info`` (with ``entry_points.txt``) in a
folder put on ``sys.path``, which ``importlib.metadata`` reads as any installed
distribution.  Nothing in the magic, the session, the widget or the registry names it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from IPython.core.error import UsageError

from jupyter_cluster import backends
from jupyter_cluster.cluster import session
from jupyter_cluster.state import registry

TOY_MODULE = '''
"""A third-party backend: an in-process cluster of one worker, with options, a view and a clean-up of its own."""

import os

from jupyter_cluster.backends import Backend, StartedCluster
from jupyter_cluster.backends.cli import Option


class ToyBackend(Backend):
    name = "toy"
    cli_options = (Option("toy_threads", "threads of the toy's one worker", int, "N"),)
    api_options = ("name",)

    def start(self, name=None, toy_threads=None, **options):
        self.check_options(options)
        from distributed import LocalCluster

        cluster = LocalCluster(
            n_workers=1, threads_per_worker=toy_threads or 1, processes=False, protocol="tcp://", host="127.0.0.1",
            dashboard_address=None, name=name,
        )
        return StartedCluster.of(cluster, extra={"toy": {"threads": toy_threads or 1}})

    async def describe(self, model, extra, client):
        info = await client.scheduler.identity()
        model["toy"] = {"threads": extra["toy"]["threads"], "workers_seen": len(info["workers"])}

    def cleanup_orphan(self, record):
        with open(os.environ["JC_TOY_CLEANED"], "a") as f:
            f.write(record.name + "\\n")
'''


@pytest.fixture
def toy_site(tmp_path, monkeypatch):
    """A folder holding the toy package and its distribution metadata, on ``sys.path``."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "jc_toy_backend.py").write_text(textwrap.dedent(TOY_MODULE))
    info = site / "jc_toy_backend-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: jc-toy-backend\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[jupyter_cluster.backends]\ntoy = jc_toy_backend:ToyBackend\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("JC_TOY_CLEANED", str(tmp_path / "cleaned"))
    yield site
    session.stop_all()
    sys.modules.pop("jc_toy_backend", None)


def test_a_registered_backend_is_offered_started_described_and_cleaned_up(ip, toy_site, tmp_path, capsys):
    assert backends.available()["toy"] == "jc_toy_backend:ToyBackend"
    assert list(backends.available())[-1] == "toy"  # after the package's own

    ip.run_line_magic("cluster", "start --help")
    help_text = capsys.readouterr().out
    assert "--toy-threads N" in help_text and "threads of the toy's one worker [toy]" in help_text

    with pytest.raises(
        UsageError, match=r"^the toy backend does not take --partition; its options are: --toy-threads, --name\.$"
    ):
        ip.run_line_magic("cluster", "start --backend toy --partition gpu")
    with pytest.raises(UsageError, match="argument --toy-threads: invalid int value: 'many'"):
        ip.run_line_magic("cluster", "start --backend toy --toy-threads many")

    handle = ip.run_line_magic("cluster", "start --backend toy --toy-threads 2 --name toy-1")
    assert (handle.name, handle.backend) == ("toy-1", "toy")
    assert handle.client.submit(sum, [1, 2]).result(timeout=30) == 3
    assert sum(handle.client.nthreads().values()) == 2
    assert registry.read("toy-1").backend == "toy"

    from jupyter_cluster.widgets.cluster import _read_model  # the widget's view asks the backend

    model = _read_model(handle)
    assert model is not None and model["toy"] == {"threads": 2, "workers_seen": 1}

    ip.run_line_magic("cluster", "stop toy-1")
    assert registry.read("toy-1") is None

    # a dead owner's record of the toy backend: the registry asks the toy's own clean-up
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    registry.write(
        registry.ClusterRecord(name="toy-dead", backend="toy", address="tcp://127.0.0.1:9", owner_pid=dead.pid)
    )
    assert "toy-dead" not in {r.name for r in registry.live_records()}
    assert (tmp_path / "cleaned").read_text() == "toy-dead\n"
    assert not os.path.exists(os.path.join(registry.registry_dir(), "toy-dead.json"))


def test_a_built_in_name_is_not_taken_over_and_a_broken_backend_is_one_sentence(toy_site):
    info = toy_site / "jc_toy_backend-1.0.dist-info"
    (info / "entry_points.txt").write_text(
        "[jupyter_cluster.backends]\ntoy = jc_toy_backend:ToyBackend\nlocal = jc_toy_backend:ToyBackend\n"
        "broken = jc_toy_missing:Nothing\n"
    )
    found = backends.available()
    assert found["local"] == "jupyter_cluster.backends.local:LocalBackend"
    with pytest.raises(
        backends.ClusterError, match=r"^the broken backend \(jc_toy_missing:Nothing\) could not be loaded"
    ):
        backends.get_backend("broken")
    assert "toy_threads" in {m.option.name for m in backends.start_options()}  # the others' flags still parse
