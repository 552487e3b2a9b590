"""From ``import jupyter_cluster`` to a first result: what the start leaves for later, and that it still works.

Each test runs a fresh interpreter (a child script), as a new kernel is: what
is imported at ``import jupyter_cluster``, what the scheduler's start leaves
out (its Bokeh dashboard) and brings in afterwards, and a map made right after
``start`` (what Run All does).  Timings are measured by
``benchmarks/startup.py``, not here.
"""

from __future__ import annotations

import json
import subprocess
import sys

from ..conftest import ROOT


def _run(script: str, timeout: float = 180) -> dict:
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(lines[-1])


IMPORT = """
import json, sys
import jupyter_cluster as jc
heavy = sorted(m for m in ("distributed", "bokeh", "IPython", "ipywidgets", "jupyter_cluster.cluster.session")
               if m in sys.modules)
names = {n: type(getattr(jc, n)).__name__ for n in ("runs", "spmd", "map", "start", "Pool", "ClusterHandle")}
import jupyter_cluster.tracking.runs, jupyter_cluster.collective.client  # the modules behind runs and spmd
after = {n: type(getattr(jc, n)).__name__ for n in ("runs", "spmd")}
shadowing = sorted(n for n in jc.__all__ if f"jupyter_cluster.{n}" in sys.modules)  # a module named as a public name
from jupyter_cluster.engine import job
print(json.dumps({"heavy": heavy, "names": names, "after": after, "shadowing": shadowing,
                  "observers": len(job._observer_factories),
                  "all": sorted(set(jc.__all__) - set(dir(jc)))}))
"""


def test_import_leaves_distributed_and_the_notebook_side_for_their_first_use():
    got = _run(IMPORT)
    assert got["heavy"] == [], f"`import jupyter_cluster` imported {got['heavy']}"
    assert got["names"] == {
        "runs": "function",
        "spmd": "function",
        "map": "function",
        "start": "function",
        "Pool": "type",
        "ClusterHandle": "type",
    }
    # the modules behind the public functions have other names, so importing them changes no public name
    assert got["after"] == {"runs": "function", "spmd": "function"}
    assert got["shadowing"] == [], "no module of the package is named as a public name"
    assert got["observers"] == 1, "maps made through mapping get the progress observer"
    assert got["all"] == [], "every name in __all__ is listed by dir()"


FIRST_MAP = """
import json, sys
import jupyter_cluster as jc
from jupyter_cluster import mapping

if __name__ == "__main__":
    handle = jc.start(workers=2, name="startup-first-map")
    try:
        first = mapping.imap(abs, [-1, -2, -3], progress=False)  # at once: no wait for workers or warm-up
        results = list(first)
        second = mapping.imap(abs, range(-20, 0), progress=False)
        again = list(second)
        client = handle.client
        print(json.dumps({
            "results": results, "again": again, "paths": [first.path, second.path],
            "leases": [first.leases, first._counters.reused, second.leases, second._counters.reused],
            "direct": getattr(client, "_jc_direct", None),
            "registered": sorted(handle.cluster.scheduler.worker_plugins),
            "dashboard_imported": "distributed.dashboard.scheduler" in sys.modules,
            "init_poll": [n.process._init_msg_interval for n in handle.cluster.workers.values()],
        }))
    finally:
        handle.close()
"""


def test_a_map_right_after_start_runs_on_leases_and_the_next_one_reuses_them():
    got = _run(FIRST_MAP)
    assert got["results"] == [1, 2, 3]
    assert got["again"] == list(range(20, 0, -1))
    assert got["paths"] == ["direct", "direct"]
    placed, reused, placed2, reused2 = got["leases"]
    assert placed + reused > 0 and placed2 + reused2 > 0, got["leases"]
    assert reused2 > 0, "the second map took over the first one's idle leases"
    assert got["direct"] is True
    # the workers started with the engine's handlers: nothing was broadcast to them for it
    assert "jupyter-cluster-engine" not in got["registered"], got["registered"]
    assert not got["dashboard_imported"], "the dashboard was imported while maps ran"
    # each forked worker's nanny looked for its registration every 5 ms, not Dask's 50
    assert got["init_poll"] == [0.005, 0.005], got["init_poll"]


DASHBOARD = """
import json, socket, sys, time
import jupyter_cluster as jc
from jupyter_cluster.backends.local import dashboard

def get(path, sock):
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(60)
        s.connect(sock)
        s.sendall(f"GET {path} HTTP/1.0\\r\\nHost: dashboard\\r\\n\\r\\n".encode())
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\\r\\n\\r\\n")
    return head.split(b" ")[1].decode(), body

if __name__ == "__main__":
    mode = sys.argv[1]
    dashboard.IDLE_SECONDS = 1.0 if mode == "idle" else 3600.0
    handle = jc.start(workers=1, name="startup-dashboard-" + mode)
    try:
        out = {"at_start": dashboard.MODULE in sys.modules}
        sock = handle.extra["dashboard_socket"]
        out["health"] = get("/health", sock)[0]  # Dask's own routes answer from the start
        if mode == "idle":
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not handle.cluster.scheduler.http_application.applications:
                time.sleep(0.1)
        out["before_request"] = bool(handle.cluster.scheduler.http_application.applications)
        status, body = get("/status", sock)
        out.update(status=status, bokeh=b"Bokeh" in body, title=body.split(b"<title>")[1].split(b"</title>")[0].decode())
        out["redirect"] = get("/", sock)[0]
        print(json.dumps(out))
    finally:
        handle.close()
"""


def test_the_dashboard_comes_after_the_start_on_its_first_request_or_once_idle():
    for mode in ("request", "idle"):
        got = _run(DASHBOARD.replace("sys.argv[1]", repr(mode)))
        assert got["at_start"] is False, f"{mode}: the start imported the Bokeh dashboard"
        assert got["before_request"] is (mode == "idle"), got
        assert got["health"] == "200", got
        # the first request waits for the dashboard (mode "request"), or it is there already (mode "idle")
        assert got["status"] == "200" and got["bokeh"] and "Dask" in got["title"], (mode, got)
        assert got["redirect"] in ("301", "302"), (mode, got)


NOTEBOOK_REPORT = """
import json
import jupyter_cluster as jc
jc.report(step=1, loss=0.5)
jc.report(step=2, loss=0.25)
print(json.dumps({"loss": jc.metrics()["loss"].tolist()}))
"""


def test_a_report_made_before_any_cluster_reaches_the_notebooks_metrics():
    # `jc.report` in a fresh kernel (no cluster yet) once went to a producer with no sink: 0 rows
    assert _run(NOTEBOOK_REPORT)["loss"] == [0.5, 0.25]


TELEMETRY = """
import json, sys, time
import jupyter_cluster as jc
from jupyter_cluster import mapping
from jupyter_cluster.telemetry import JOBS_TOPIC, PLUGIN_NAME
from jupyter_cluster.tracking import progress

def step(x):
    from jupyter_cluster import report  # the package itself does not pickle

    report(step=x, topic="startup-telemetry", value=x * 0.5)
    return x

def plugins(dask_worker):
    return {name: type(plugin).__name__ for name, plugin in dask_worker.plugins.items()}

if __name__ == "__main__":
    handle = jc.start(workers=2, name="startup-telemetry")
    try:
        scheduler = handle.cluster.scheduler
        calls = []
        register = scheduler.handlers["register_worker_plugin"]

        async def counted(*args, **kwargs):
            calls.append(kwargs.get("name"))
            return await register(*args, **kwargs)

        scheduler.handlers["register_worker_plugin"] = counted
        progress.set_renderer("none")
        results = mapping.map(step, range(6), progress=True)
        observer = progress.recent[-1]
        snapshot = observer.model.snapshot()
        df = jc.metrics("startup-telemetry")  # waits for the first map's subscription, then syncs
        deadline = time.monotonic() + 60
        states = []
        while time.monotonic() < deadline and "finished" not in states:
            states = [msg.get("state") for _, msg in handle.client.get_events(JOBS_TOPIC)
                      if isinstance(msg, dict) and msg.get("job") == snapshot["job"]]
            time.sleep(0.1)
        print(json.dumps({
            "results": results, "calls": calls, "registered": sorted(scheduler.worker_plugins),
            "workers": list(handle.client.run(plugins).values()), "plugin": PLUGIN_NAME,
            "snapshot": {k: snapshot[k] for k in ("total", "done", "state")},
            "steps": sorted(df["step"].tolist()), "values": sorted(df["value"].tolist()), "states": states,
        }))
    finally:
        handle.close()
"""


def test_a_local_clusters_workers_start_with_the_telemetry_plugin_and_a_first_map_registers_none():
    got = _run(TELEMETRY)
    assert got["results"] == list(range(6))
    # nothing was broadcast to the workers on the first map (nor since the start: the registry is empty of it)
    assert got["calls"] == [], got["calls"]
    assert got["plugin"] not in got["registered"], got["registered"]
    assert len(got["workers"]) == 2 and all(w.get(got["plugin"]) == "FlushPlugin" for w in got["workers"]), got[
        "workers"
    ]
    # progress and report() still work: the job's counts and its messages on the jobs topic, every report
    assert got["snapshot"] == {"total": 6, "done": 6, "state": "finished"}, got["snapshot"]
    assert "finished" in got["states"], got["states"]
    assert got["steps"] == list(range(6)) and got["values"] == [x * 0.5 for x in range(6)]


LOAD_EXT = """
import json, sys
from jupyter_cluster._core import background as _background
_background.MODULES = tuple(m for m in _background.MODULES if m != "distributed")  # only the magics could import it
from IPython.core.interactiveshell import InteractiveShell

shell = InteractiveShell.instance()
shell.run_line_magic("load_ext", "jupyter_cluster")
_background.wait()
out = {"loaded": "distributed" in sys.modules, "magics": sorted(set(shell.magics_manager.magics["line"]) & {"cluster", "spmd"})
       + sorted(set(shell.magics_manager.magics["cell"]) & {"parallel", "spmd"})}
errors = {}
for cell in ("%%spmd --backend bogus\\npass", "%%parallel x in range(2) --retries -1\\nx", "%cluster bogus"):
    error = shell.run_cell(cell).error_in_exec
    errors[cell.split()[0]] = [type(error).__name__, str(error).splitlines()[0]]
out["errors"], out["after_errors"] = errors, "distributed" in sys.modules
out["list"] = type(shell.run_cell("%cluster list").error_in_exec).__name__
out["after_list"] = "distributed" in sys.modules
import importlib
spmd = importlib.import_module("jupyter_cluster.collective.client")
from jupyter_cluster.magics import spmd_magic
out["backends"] = [list(spmd.BACKENDS), list(spmd_magic.BACKENDS)]
print(json.dumps(out))
"""


def test_load_ext_leaves_distributed_to_the_background_import_and_the_magics_still_work():
    got = _run(LOAD_EXT)
    assert got["loaded"] is False, "%load_ext imported distributed in the foreground"
    assert got["magics"] == ["cluster", "spmd", "parallel", "spmd"]
    # the magics' own checks come before any import of the layers below, with their messages unchanged
    assert got["errors"] == {
        "%%spmd": [
            "UsageError",
            "%%spmd: argument --backend: invalid choice: 'bogus' (choose from 'gloo', 'nccl', 'auto').",
        ],
        "%%parallel": [
            "UsageError",
            "%%parallel: --retries must be 0 or more and --timeout a positive number of seconds.",
        ],
    } | {"%cluster": got["errors"]["%cluster"]}, got["errors"]
    assert got["errors"]["%cluster"][0] == "UsageError"
    assert got["errors"]["%cluster"][1].startswith(
        "%cluster: argument command: invalid choice: 'bogus' (choose from 'status'"
    )
    assert got["after_errors"] is False
    # a magic that needs the session imports it on its first run
    assert got["list"] == "NoneType" and got["after_list"] is True
    assert got["backends"][0] == got["backends"][1], (
        "spmd_magic.BACKENDS must list jupyter_cluster.collective.client.BACKENDS"
    )


NOTEBOOK_FUNCTION_NAMING_JC = """
import json
import cloudpickle
import jupyter_cluster as jc

def measured(i):  # defined in __main__, as in a notebook: pickled by value, with `jc` among its globals
    jc.report(step=i, topic="named", value=i * 0.5)
    return i

jc.start(workers=1)
out = jc.map(measured, range(4), progress=False)
rows = jc.metrics("named")
print(json.dumps({"out": out, "values": sorted(rows["value"].tolist()), "same": cloudpickle.loads(cloudpickle.dumps(jc)) is jc}))
jc.stop()
"""


def test_a_notebook_function_that_names_the_package_travels_to_the_workers():
    # the lazily loading package is a ModuleType subclass, which pickle could not reduce: "cannot pickle
    # '_Package' object" for every cell function that calls jc.report (found by the as-installed check)
    got = _run(NOTEBOOK_FUNCTION_NAMING_JC)
    assert got == {"out": [0, 1, 2, 3], "values": [0.0, 0.5, 1.0, 1.5], "same": True}


LOAD_EXT_ENVIRONMENT = """
import json, os, sys
KEYS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MALLOC_TRIM_THRESHOLD_", "PYTHONHASHSEED", "JC_EXTRA")
for key in KEYS:  # none of them set by the user: what the kernel has after is what the package set
    os.environ.pop(key, None)
# a user's own pre-spawn variable, under dask's other spelling of the key: Dask's defaults still apply
os.environ["DASK_DISTRIBUTED__NANNY__PRE_SPAWN_ENVIRON"] = "{'JC_EXTRA': 'yes'}"
import psutil
from IPython.core.interactiveshell import InteractiveShell

def mine():
    return {k: os.environ.get(k) for k in KEYS}

shell = InteractiveShell.instance()
shell.run_line_magic("load_ext", "jupyter_cluster")
from jupyter_cluster.backends.local import forkserver
forkserver._forkserver_thread.join(60)
from multiprocessing import forkserver as mp_forkserver
server = psutil.Process(mp_forkserver._forkserver._forkserver_pid).environ()
out = {"after_load_ext": mine(), "server": {k: server.get(k) for k in KEYS}}
assert shell.run_cell("%cluster start --workers 1 --name startup-environment").error_in_exec is None
import jupyter_cluster as jc
handle = jc.current()
try:
    out["after_start"] = mine()
    out["worker"] = next(iter(handle.client.run(eval, "dict(env={k: __import__('os').environ.get(k) for k in %r}, "
                                                "hash=hash('jupyter-cluster'))" % (KEYS,)).values()))
finally:
    handle.close()
print(json.dumps(out))
"""


def test_load_ext_and_a_start_leave_the_kernels_environment_and_the_workers_get_dasks():
    # The fork server began at %load_ext once set Dask's pre-spawn variables (OMP_NUM_THREADS=1 ...) in
    # the kernel itself, and Dask's nannies do so at every worker start: numpy imported in the notebook
    # afterwards ran on one thread.
    got = _run(LOAD_EXT_ENVIRONMENT)
    none = dict.fromkeys(got["after_load_ext"])
    assert got["after_load_ext"] == none, got
    assert got["after_start"] == none, got
    dask_env = {
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MALLOC_TRIM_THRESHOLD_": "65536",
        "PYTHONHASHSEED": "6640",
        "JC_EXTRA": "yes",
    }
    # the fork server's interpreter started with them (the hash seed is read only then), and so its workers
    assert got["server"] == dask_env, got["server"]
    assert got["worker"]["env"] == dask_env, got["worker"]
    seeded = subprocess.run(
        [sys.executable, "-c", "print(hash('jupyter-cluster'))"],
        env={"PYTHONHASHSEED": "6640", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert got["worker"]["hash"] == int(seeded.stdout), "the worker's interpreter did not start with PYTHONHASHSEED"


USERS_FORKSERVER = """
import json, multiprocessing, os
os.environ.pop("JC_LATE", None)
with multiprocessing.get_context("forkserver").Pool(1) as pool:  # the user's own fork server, first
    pool.map(abs, [1])
os.environ["JC_LATE"] = "set after that server started"
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
shell.run_line_magic("load_ext", "jupyter_cluster")
assert shell.run_cell("%cluster start --workers 1 --name startup-users-forkserver").error_in_exec is None
import jupyter_cluster as jc
handle = jc.current()
try:
    got = next(iter(handle.client.run(os.environ.get, "JC_LATE").values()))
finally:
    handle.close()
print(json.dumps({"worker": got}))
"""


def test_a_fork_server_the_user_ran_first_still_gives_workers_the_notebooks_variables():
    # A fork server someone else started has an environment (and signal mask) we do not know: the
    # workers are spawned as Dask spawns them (use_forkserver), and so have the notebook's variables.
    got = _run(USERS_FORKSERVER)
    assert got == {"worker": "set after that server started"}, got


IMPORT_IN_IPYTHON = """
import json, sys
from IPython.core.interactiveshell import InteractiveShell

shell = InteractiveShell.instance()
import jupyter_cluster
deferred = shell.display_formatter.mimebundle_formatter.deferred_printers
print(json.dumps({"registered": ("jupyter_cluster.cluster.session", "ClusterHandle") in deferred,
                  "heavy": sorted(m for m in ("ipywidgets", "jupyter_cluster.cluster.session", "distributed") if m in sys.modules)}))
"""


def test_import_in_a_running_shell_registers_the_handles_display_by_name():
    got = _run(IMPORT_IN_IPYTHON)
    assert got == {"registered": True, "heavy": []}, got


BACKGROUND_WAIT = """
import json, os, sys, tempfile, threading, time
folder = tempfile.mkdtemp()
with open(os.path.join(folder, "jc_slow_toolkit.py"), "w") as f:
    f.write("import os, time\\n"  # held until released
            "while not os.path.exists(os.path.join(os.path.dirname(__file__), 'release')):\\n    time.sleep(0.01)\\n")
sys.path.insert(0, folder)
from jupyter_cluster._core import background as _background
_background.MODULES = ("distributed", "jc_slow_toolkit")
_background.start()
t0 = time.monotonic()
_background.wait()
waited = time.monotonic() - t0
out = {"distributed": "distributed" in sys.modules and hasattr(sys.modules["distributed"], "LocalCluster"),
       "toolkit_done": _background._thread.is_alive() is False, "waited": waited}
open(os.path.join(folder, "release"), "w").close()
_background._thread.join(60)
out["then_done"] = not _background._thread.is_alive()
print(json.dumps(out))
"""


def test_a_start_waits_for_the_background_import_of_distributed_not_of_the_widget_toolkit():
    # ipywidgets (0.2-0.3 s) is imported after distributed; a start right after %load_ext (Run All)
    # once waited for it too, although it needs it only to show its widget once started
    got = _run(BACKGROUND_WAIT)
    assert got["distributed"] is True, got
    assert got["toolkit_done"] is False and got["waited"] < 30, got
    assert got["then_done"] is True, got
