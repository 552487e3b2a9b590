"""Shared fixtures: an isolated cluster registry, real clusters, a real IPython shell.

Area-specific fixtures belong in the test module that needs them (or a
``tests/<area>/conftest.py``); this file holds only what every area uses.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import dask.config
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The clusters this process starts keep the spawned fork server a kernel's get: forked from pytest
# (backends/local/fork_self.py), their workers would hold every module pytest imported, and the tests
# of what a worker process holds would test pytest.  The scripts the tests run fork themselves.
dask.config.set({"jupyter-cluster.local.fork-script": False})


#: Markers whose tests run only when asked for (distributed's ``--runslow`` is the model): ``make test`` is
#: the fast default, ``make test-all`` (and CI) adds ``--run-all``.
OPT_IN = {
    "slow": "takes more than ~20 s",
    "browser": "needs a headless Chromium",
    "netns": "needs root and network namespaces",
}


def pytest_addoption(parser):
    group = parser.getgroup("jupyter_cluster", "jupyter_cluster's opt-in test layers")
    group.addoption("--run-all", action="store_true", help="also run the slow, browser and netns tests")
    for marker, what in OPT_IN.items():
        group.addoption(f"--run-{marker}", action="store_true", help=f"also run the tests marked {marker} ({what})")


#: The test modules that take longest, longest first (seconds of two pytest-xdist processes on the 2-core machine,
#: 2026-12-05: the fast layer's and the opt-in tests' together).  `make test` hands whole modules to its two
#: processes in this order (``--dist loadfile --no-loadscope-reorder``), then the others, most tests first
#: (pytest-xdist's own order): a long module begun last would keep one process running alone at the end.
LONGEST_FIRST = (
    "tests/packaging/test_notebooks.py",  # 290 (opt-in)
    "tests/ui/test_panel_follow.py",  # 230 (opt-in)
    "tests/ui/test_panel_scale.py",  # 220 (opt-in)
    "tests/cluster/test_quiet_exit.py",  # 210, 100 of them in the fast layer
    "tests/ui/test_panel.py",  # 200 (opt-in)
    "tests/backends/test_slurm.py",  # 200 (opt-in)
    "tests/backends/test_ssh.py",  # 150 (opt-in)
    "tests/ui/test_reopen.py",  # 130 (opt-in)
    "tests/ui/test_identity.py",  # 120 (opt-in)
    "tests/server/test_history.py",  # 110
    "tests/cluster/test_scripts.py",  # 100
    "tests/ui/test_sweep_colours.py",  # 90 (opt-in)
    "tests/cluster/test_security.py",  # 90, 20 in the fast layer
    "tests/collective/test_spmd.py",  # 90, 60 in the fast layer
    "tests/engine/test_demand.py",  # 90, 35 in the fast layer
    "tests/cluster/test_startup.py",  # 90
    "tests/engine/test_memory.py",  # 85
    "tests/multiprocessing/test_cpython.py",  # 80, 40 in the fast layer
    "tests/server/test_server.py",  # 75
    "tests/ui/test_detached_panel.py",  # 60 (opt-in)
    "tests/packaging/test_benchmarks_smoke.py",  # 55, 15 in the fast layer
    "tests/backends/test_gateway.py",  # 50 (opt-in)
    "tests/detached/test_host.py",  # 50 (opt-in)
    "tests/ui/test_sweep_table.py",  # 50 (opt-in)
    "tests/detached/test_server.py",  # 45 (opt-in)
    "tests/engine/test_direct.py",  # 45
    "tests/ui/test_charts.py",  # 45 (opt-in)
    "tests/server/test_runs.py",  # 45
    "tests/widgets/test_static_outputs.py",  # 40
    "tests/engine/test_cluster.py",  # 40
)


def _longest_first(items) -> None:
    """Order ``items`` module by module as :data:`LONGEST_FIRST` says; a module's own tests keep their order."""
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    count: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        count[module] = count.get(module, 0) + 1
    first_seen = {m: i for i, m in enumerate(count)}

    def key(item):
        module = item.nodeid.split("::", 1)[0]
        return (rank.get(module, len(rank)), -count[module], first_seen[module])

    items.sort(key=key)  # stable: a module's items stay in order


def pytest_collection_modifyitems(config, items):
    _longest_first(items)
    for item in items:
        if "browser" in getattr(item, "fixturenames", ()):  # a test that drives Chromium is a browser test
            item.add_marker(pytest.mark.browser)
    if config.getoption("--run-all"):
        return
    skipped = {m for m in OPT_IN if not config.getoption(f"--run-{m}")}
    for item in items:
        wanted = skipped.intersection(item.keywords)
        if wanted:
            flags = " ".join(f"--run-{m}" for m in sorted(wanted))
            item.add_marker(
                pytest.mark.skip(reason=f"opt-in ({', '.join(sorted(wanted))}): {flags} or --run-all (make test-all)")
            )


def pytest_configure(config):
    # A runner that starts the suite in the background of a shell without job control (`make test &`)
    # hands it SIGINT ignored, which every kernel and child inherits; the stop-button tests need Ctrl-C
    # as a user's terminal and JupyterLab's kernels have it.  A hook, not module code: worker processes
    # import this module too (to unpickle test classes), and they must keep ignoring SIGINT.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session", autouse=True)
def isolated_runtime_dir(tmp_path_factory):
    """Every test session gets its own Jupyter runtime dir, so the registry is private.

    Set through the environment so that kernels, Jupyter servers and worker
    processes started by tests inherit it.
    """
    path = tmp_path_factory.mktemp("jupyter-runtime")
    old = os.environ.get("JUPYTER_RUNTIME_DIR")
    os.environ["JUPYTER_RUNTIME_DIR"] = str(path)
    yield path
    if old is None:
        os.environ.pop("JUPYTER_RUNTIME_DIR", None)
    else:
        os.environ["JUPYTER_RUNTIME_DIR"] = old


@pytest.fixture(scope="session")
def ip():
    """The real IPython InteractiveShell, with ``%load_ext jupyter_cluster`` done."""
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()
    shell.run_line_magic("load_ext", "jupyter_cluster")
    return shell


@pytest.fixture(scope="module")
def cluster(request):
    """A real 2-worker local cluster (processes), current for the module's tests.

    A module marked ``cluster_config(settings)`` starts it under those Dask settings (the fault tests'
    ``distributed.scheduler.allowed-failures: 1``, so that a poison pill costs few worker restarts).
    """
    import dask
    import distributed  # noqa: F401  (its config defaults must exist before dask.config.set)

    import jupyter_cluster as jc

    mark = request.node.get_closest_marker("cluster_config")
    with dask.config.set(mark.args[0] if mark else {}):
        handle = jc.start(workers=2, threads=1)
    yield handle
    if not handle.closed:
        handle.close()


@pytest.fixture(scope="module")
def cpython_cases_cluster(cluster):
    """The module's 2-worker cluster, current for CPython's own multiprocessing cases bound to our names.

    The cases are ``unittest`` classes, which take no fixture arguments: their module asks for this one with
    ``pytestmark = pytest.mark.usefixtures("cpython_cases_cluster")`` (``tests/pool``, ``tests/multiprocessing``).
    Some cases leave empty files named like ``test.support.os_helper.TESTFN`` (``@test_<pid>_tmp...``, the pid a
    worker's) in the working directory, the checkout: they are removed afterwards.
    """
    before = set(os.listdir("."))
    yield cluster
    for name in set(os.listdir(".")) - before:
        if name.startswith("@test_") and os.path.isfile(name):
            os.remove(name)


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.05, message: str = "condition"):
    """Poll ``predicate`` until it is truthy; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {message}")
        time.sleep(interval)


@pytest.fixture
def python_exe():
    return sys.executable
