"""The backends' declared options and hooks, without a cluster: what ``%cluster start`` is built from."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

import pytest

from jupyter_cluster import backends
from jupyter_cluster.backends import StartedCluster, cli
from jupyter_cluster.errors import ClusterError
from jupyter_cluster.state import orphans

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib")
def test_the_shipped_backends_are_the_ones_pyproject_registers():
    """``_SHIPPED`` stands in for an install whose metadata predates the group: it must not drift."""
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        registered = tomllib.load(f)["project"]["entry-points"][backends.GROUP]
    assert registered == backends._SHIPPED
    assert list(backends.available())[: len(registered)] == list(registered)


def test_every_built_in_backend_declares_its_options_and_shared_flags_parse_alike():
    classes = backends.backend_classes()
    assert set(backends._SHIPPED) <= set(classes)
    first: dict[str, cli.Option] = {}
    for name, cls in classes.items():
        assert cls.name == name
        assert set(cls.options) == {o.name for o in cls.cli_options} | set(cls.api_options)
        for option in cls.cli_options:
            assert option.help and not option.help.endswith(".")
            seen = first.setdefault(option.name, option)
            assert seen.parses_like(option), (name, option.name)
    assert {"name"} <= set(classes["local"].options) and "processes" in classes["local"].options
    assert "name" not in classes["address"].options  # an attached cluster keeps the name it is given


def test_one_flag_per_option_with_the_backends_that_take_it():
    merged = {m.option.name: m for m in backends.start_options()}
    workers = merged["workers"]
    assert workers.backends[0] == "local" and "slurm" in workers.backends and "address" not in workers.backends
    assert workers.help() == "number of workers to start [" + ", ".join(workers.backends) + "]"
    # the same flag, another meaning per backend: each text once, with its backends
    address = merged["address"].help()
    assert "[address]" in address and "[gateway]" in address and address.count(";") == 1
    assert merged["dry_run"].help().endswith("[slurm, pbs, sge, lsf]")


def test_each_kind_of_option_parses_as_the_command_line_writes_it():
    parser = argparse.ArgumentParser()
    for option in (
        cli.WORKERS,
        cli.TLS,
        cli.Option("env", "e", kind="list"),
        cli.Option("gpus", "g", kind="optional"),
        cli.Option("dry_run", "d", kind="flag"),
    ):
        for flags, kwargs in option.argparse_arguments(option.help):
            parser.add_argument(*flags, **kwargs)
    args = vars(parser.parse_args([]))
    assert args == {"workers": None, "tls": None, "env": None, "gpus": None, "dry_run": None}
    args = vars(parser.parse_args("--workers 3 --no-tls --env A=1 B=2 --env C=3 --gpus --dry-run".split()))
    assert args == {"workers": 3, "tls": False, "env": ["A=1", "B=2", "C=3"], "gpus": True, "dry_run": True}
    assert vars(parser.parse_args(["--tls", "--gpus", "0,1"]))["gpus"] == "0,1"
    assert cli.MEMORY_LIMIT.flag == "--memory-limit"


def test_an_option_another_backend_takes_is_refused_in_one_sentence():
    with pytest.raises(
        ClusterError, match=r"^the address backend does not take --workers; its options are: --address, --security\.$"
    ):
        backends.get_backend("address").check_options({"workers": 2})


def test_an_unknown_or_broken_backend_is_one_sentence():
    with pytest.raises(ClusterError, match=r"^unknown backend 'nosuch'; choose one of: .*local"):
        backends.get_backend("nosuch")
    assert backends.describer("nosuch") is None


def test_started_cluster_of_a_cluster_object_takes_its_address_and_dashboard():
    class Made:
        scheduler_address = "tls://127.0.0.1:1"
        dashboard_link = "http://127.0.0.1:2/status"

    started = StartedCluster.of(Made(), extra={"k": 1})
    assert (started.address, started.dashboard_link, started.extra) == (
        Made.scheduler_address,
        Made.dashboard_link,
        {"k": 1},
    )
    assert StartedCluster.of(Made(), dashboard_link=None).dashboard_link is None


def test_only_a_backend_with_a_view_of_its_own_is_asked_to_describe():
    assert backends.describer("local") is None and backends.describer("gateway") is None
    assert backends.describer("slurm") is not None


def test_a_batch_clusters_view_is_its_jobs_facts_from_the_scheduler():
    """The SLURM view the server and the widget both show, built by the backend from the scheduler's metadata."""
    from jupyter_cluster.backends.jobqueue.facts import FACTS_KEY

    facts = {
        "system": "slurm",
        "updated": 5.0,
        "jobs": [
            {"job_id": "11", "state": "RUNNING", "node": "n1", "walltime_left": "10:00", "worker": "w0"},
            {"job_id": "12", "state": "PENDING", "reason": "Resources"},
        ],
    }

    class Client:  # what describe asks of the cluster's client: one metadata read
        async def get_metadata(self, keys, default=None):
            assert keys == list(FACTS_KEY)
            return facts

    describe = backends.describer("slurm")
    model = {"workers": [{"name": "w0"}]}
    asyncio.run(describe({}, {}, Client()))  # not a batch record: nothing asked, nothing added
    asyncio.run(describe(model, {"batch": {"system": "slurm"}}, Client()))
    assert model["workers"][0]["job_id"] == "11" and model["batch"]["pending_jobs"] == [
        {"job_id": "12", "reason": "Resources"}
    ]


def test_no_remote_list_where_none_is_configured():
    import dask

    with dask.config.set({"gateway.address": None}):
        assert [cls().list_remote() for cls in backends.backend_classes().values()] == [None] * len(
            backends.available()
        )


def test_the_launcher_shows_the_default_size_its_backend_gives():
    """The widget asks the backend (``Backend.default_workers``), not the local backend's module."""
    import dask

    from jupyter_cluster.widgets.launcher import Launcher

    assert backends.Backend().default_workers() is None and backends.get_backend("slurm").default_workers() is None
    with dask.config.set({"jupyter-cluster.local.workers": 3}):
        assert backends.get_backend("local").default_workers() == 3
        launcher = Launcher()
        assert launcher.workers.value == 3
        launcher.close()
    with dask.config.set({"jupyter-cluster.local.workers": None}):
        assert backends.get_backend("local").default_workers() == len(os.sched_getaffinity(0))


def test_the_gateway_backend_gives_the_dashboard_proxy_its_login_never_a_password_over_plain_http():
    """The Jupyter server's dashboard proxy asks the record's backend (``Backend.dashboard_login``) for its login."""
    import base64

    import dask

    pytest.importorskip("dask_gateway")
    from jupyter_cluster.server.gateway_dashboard import Refused, auth_headers

    basic = {"gateway.auth.type": "basic", "gateway.auth.kwargs": {"username": "alice", "password": "pw"}}
    with dask.config.set(basic):
        expected = {"Authorization": "Basic " + base64.b64encode(b"alice:pw").decode()}
        assert backends.dashboard_login("gateway", "http://127.0.0.1:8000") == expected
        assert auth_headers("https://192.0.2.1:8000", "gateway") == expected
        with pytest.raises(ClusterError, match="plain http:// to another machine"):
            backends.dashboard_login("gateway", "http://192.0.2.1:8000")
        with pytest.raises(Refused, match="plain http:// to another machine"):
            auth_headers("http://192.0.2.1:8000", "gateway")
        # a backend with no login of its own (or none known here) sends none
        assert backends.dashboard_login("local", "http://192.0.2.1:8000") == {}
        assert backends.dashboard_login("nosuch", "http://192.0.2.1:8000") == {}


def test_the_backends_install_the_registrys_clean_up_hook():
    """The registry (state) asks the dead owner's backend through the hook the backends' package installs."""
    assert orphans._hook is backends.cleanup_orphan

    class Record:  # a record naming no backend installed here, or code: nothing is run
        name = "x"
        attached = False
        extra: dict = {}

    for backend in ("nosuch", "os:system", ["slurm"]):
        Record.backend = backend  # type: ignore[attr-defined]
        orphans.clean_up(Record())
