"""The example notebooks, executed top to bottom through a real kernel at CI size.

Each notebook checks its own claims with ``assert`` cells (ES learns CartPole, PBT beats its
fixed-hyperparameter baseline, MoE collapses without the auxiliary loss and balances with it),
so a failed claim fails the run.  Cells tagged ``raises-exception`` are the only ones allowed
to raise; nbclient enforces that.  Every notebook starts its cluster with a plain
``%cluster start`` (backend from configuration), which the test pins to 2 single-threaded local
workers through the environment, exactly as a user would for Kubernetes.

The notebooks are committed with their outputs (``make notebooks``, .ci/execute_notebooks.py): a
reader on GitHub or nbviewer sees the charts as the widgets' static copies.  The tests check that
they are stored that way and that a fresh execution still gives each cell the same kinds of output.
"""

from __future__ import annotations

import json
import os
import re
import time

import nbformat
import pytest

from ..conftest import ROOT
from ..helpers import ANSI, cell_text

NOTEBOOKS_DIR = os.path.join(ROOT, "notebooks")
NOTEBOOKS = [
    "01-quickstart.ipynb",
    "02-evolution-strategies.ipynb",
    "03-population-based-training.ipynb",
    "04-mixture-of-experts.ipynb",
    "05-expert-parallel-moe.ipynb",
]


def _publishing_env() -> dict[str, str]:
    """``CI_ENV`` of .ci/execute_notebooks.py (``make notebooks``): one definition for both."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "execute_notebooks", os.path.join(ROOT, ".ci", "execute_notebooks.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return dict(module.CI_ENV)


CI_ENV = _publishing_env()


def _read(name: str):
    return nbformat.read(os.path.join(NOTEBOOKS_DIR, name), as_version=4)


def test_notebook_set_is_complete_and_linked_from_the_readme():
    present = sorted(f for f in os.listdir(NOTEBOOKS_DIR) if f.endswith(".ipynb"))
    assert present == NOTEBOOKS
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    for name in NOTEBOOKS:
        assert f"(notebooks/{name})" in readme, f"README does not link notebooks/{name}"


#: the most one published notebook may weigh (its charts are SVG images in the outputs)
SIZE_BUDGET = 300 * 1024
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_published_with_outputs_and_portable(name):
    """Executed top to bottom with static charts and no per-run noise; a CI/full size switch; a backend-free %cluster start."""
    path = os.path.join(NOTEBOOKS_DIR, name)
    with open(path) as f:
        raw = json.load(f)
    nbformat.validate(nbformat.from_dict(raw))
    assert os.path.getsize(path) <= SIZE_BUDGET, f"{name}: {os.path.getsize(path)} bytes"
    code = [c for c in raw["cells"] if c["cell_type"] == "code"]
    counts = [c.get("execution_count") for c in code]
    assert counts == list(range(1, len(code) + 1)), f"{name}: not executed top to bottom; run `make notebooks`"
    outputs = [o for c in code for o in c["outputs"]]
    assert not any(WIDGET_VIEW in o.get("data", {}) for o in outputs), "widget references a reader cannot see"
    assert "widgets" not in raw["metadata"] and not any("execution" in c["metadata"] for c in code)
    html = ["".join(o.get("data", {}).get("text/html", "")) for o in outputs]  # stored as a list of lines
    charts = [h for h in html if "jupyter-cluster-metrics" in h]
    assert charts and all("data:image/svg+xml;base64," in h for h in charts), name
    text = json.dumps(outputs)
    assert not re.search(r"127\.0\.0\.1:\d", text), "a loopback port in the outputs: run .ci/execute_notebooks.py"
    sources = ["".join(c["source"]) for c in code]
    params = [s for s, c in zip(sources, code) if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(params) == 1 and "JUPYTER_CLUSTER_EXAMPLES_SIZE" in params[0]
    starts = [line.strip() for s in sources for line in s.splitlines() if line.strip().startswith("%cluster start")]
    # only the configuration may choose the backend, so the notebook runs unchanged on Kubernetes
    assert starts == ["%cluster start"], starts
    assert any("%cluster stop" in s for s in sources)
    markdown = " ".join("".join(c["source"]) for c in raw["cells"] if c["cell_type"] == "markdown")
    assert "Kubernetes" in markdown and "DASK_JUPYTER_CLUSTER__BACKEND" in markdown


def test_make_notebooks_executes_them_with_the_publishing_script(tmp_path):
    import shutil
    import subprocess

    if shutil.which("make") is None:
        pytest.skip("needs make")
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    out = subprocess.run(
        ["make", "--no-print-directory", "-n", "notebooks", f"VENV={tmp_path}/venv"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1].startswith(f"{tmp_path}/venv/bin/python .ci/execute_notebooks.py")
    # the size and cluster the tests run them at (ci_size below sets the publishing script's own CI_ENV)
    assert CI_ENV["JUPYTER_CLUSTER_EXAMPLES_SIZE"] == "ci" and CI_ENV["DASK_JUPYTER_CLUSTER__LOCAL__WORKERS"] == "2"


def _output_kinds(nb) -> list[list[str]]:
    """Per code cell, the kinds of output it shows: errors, stdout, and each result's mimetypes.

    A widget's reference is left out (the published notebooks keep only the static copies), and so
    are progress lines (shown only when a map outlasts a second, which depends on the machine) and
    stderr (warnings of a loaded machine).
    """
    kinds = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        found = set()
        for o in cell.outputs:
            if o.output_type == "stream":
                if o.name == "stdout":
                    found.add("stdout")
            elif o.output_type == "error":
                found.add(f"error {o.ename}")
            else:
                data = o.get("data", {})
                if "jupyter-cluster-progress" in data.get("text/html", ""):
                    continue
                found.add(" ".join(sorted(k for k in data if k != WIDGET_VIEW)))
        kinds.append(sorted(found))
    return kinds


@pytest.fixture
def ci_size(monkeypatch):
    """What the kernel (and its cluster) inherits: CI size, 2 single-threaded workers (as `make notebooks`)."""
    for name, value in CI_ENV.items():
        monkeypatch.setenv(name, value)


def _execute(name: str):
    from nbclient import NotebookClient

    nb = _read(name)
    client = NotebookClient(
        nb,
        timeout=300,  # per cell
        kernel_name="python3",
        resources={"metadata": {"path": NOTEBOOKS_DIR}},
        store_widget_state=True,  # the live charts' last state, checked below
    )
    started = time.monotonic()
    client.execute()  # raises CellExecutionError on any error outside raises-exception cells
    print(f"{name}: {time.monotonic() - started:.1f} s")
    published = _output_kinds(_read(name))
    fresh = _output_kinds(nb)
    changed = [(i, p, f) for i, (p, f) in enumerate(zip(published, fresh)) if p != f]
    assert not changed, (
        f"{name}: the committed outputs differ in kind from a fresh run (code cell, committed, fresh): {changed}; run `make notebooks`"
    )
    return nb


def _example_run(test):
    """Mark a test that runs an example notebook: slow, 10 minutes at most."""
    return pytest.mark.slow(pytest.mark.timeout(600)(test))


def _chart(nb, topic: str) -> dict:
    """The data model the notebook's live chart of ``topic`` last received from the kernel."""
    states = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
    found = [
        m["state"]["data"] for m in states.values() if m.get("state", {}).get("topic") == topic and "data" in m["state"]
    ]
    assert found, f"no live chart of topic {topic!r} in the widget state"
    return found[0]


def _cell(nb, needle: str):
    found = [c for c in nb.cells if c.cell_type == "code" and needle in c.source]
    assert found, f"no cell contains {needle!r}"
    return found[0]


@_example_run
def test_quickstart_runs(ci_size):
    nb = _execute("01-quickstart.ipynb")
    out = cell_text(_cell(nb, "%cluster start"))
    assert "Started cluster" in out
    # the raise-mode cell really raised, with the item and the cell's own line
    err = [o for o in _cell(nb, "%%parallel x in [4, 2, 0, 1]\n").outputs if o.output_type == "error"]
    assert err and err[0]["ename"] == "ZeroDivisionError"
    tb = ANSI.sub("", "\n".join(err[0]["traceback"]))
    assert "item 2 (0)" in tb and "line 3" in tb
    assert "1 of 4 items failed" in cell_text(_cell(nb, "--errors collect"))
    assert "[item 0] item 0 is alpha" in cell_text(_cell(nb, 'enumerate(["alpha"'))
    assert "Stopped cluster" in cell_text(nb.cells[-1])
    chart = _chart(nb, "walks")
    assert sorted(chart["scalars"]["position"]) == [f"walk=walk {w}" for w in range(4)]
    assert all(len(points) == 25 for points in chart["scalars"]["position"].values())
    assert all(len(v["rows"]) == 25 for v in chart["vectors"]["visits"].values())


@_example_run
def test_evolution_strategies_learns(ci_size):
    nb = _execute("02-evolution-strategies.ipynb")
    out = cell_text(_cell(nb, "for generation in range(GENERATIONS)"))
    solved = re.search(r"solved: the policy's mean return ([\d.]+) >= ([\d.]+) after (\d+) generations", out)
    assert solved, out[-2000:]
    assert float(solved.group(1)) >= float(solved.group(2))
    generations = int(solved.group(3))
    chart = _chart(nb, "es")
    assert [p[0] for p in chart["scalars"]["policy_mean"]["all"]] == list(range(generations))
    print(f"02-evolution-strategies: solved after {generations} generations")


@_example_run
def test_population_based_training_replaces_members(ci_size):
    nb = _execute("03-population-based-training.ipynb")
    out = cell_text(_cell(nb, "for round_ in range(ROUNDS)"))
    # exploit events are shown as they happen
    assert re.search(r"member \d+ \([-\d.]+, lr [\d.e+-]+\) <- member \d+", out), out[-2000:]
    chart = _chart(nb, "pbt")  # one series per member, a point per round
    assert sorted(chart["scalars"]["score"]) == sorted(f"member={m}" for m in range(8))
    assert all(len(points) == 8 for points in chart["scalars"]["score"].values())


@_example_run
def test_mixture_of_experts_shows_collapse_and_balance(ci_size):
    nb = _execute("04-mixture-of-experts.ipynb")
    out = cell_text(_cell(nb, "for (experts, k, cf), pair in table.groupby"))
    assert out.count("busiest expert") == 3, out
    chart = _chart(nb, "moe")  # a tokens-per-expert heatmap and a dropped-tokens line per run
    heatmaps = chart["vectors"]["tokens_per_expert"]
    assert len(heatmaps) == 6 and len(chart["scalars"]["dropped_tokens"]) == 6
    for key, heat in heatmaps.items():
        experts = int(re.search(r"E=(\d+)", key).group(1))
        assert len(heat["rows"]) == 200 and all(len(row) == experts for row in heat["rows"]), key


@_example_run
def test_expert_parallel_moe_matches_its_reference_and_balances(ci_size):
    nb = _execute("05-expert-parallel-moe.ipynb")
    check = cell_text(_cell(nb, "worst = max("))
    found = re.search(r"largest difference ([\d.e+-]+) \(tolerance 1e-09\)", check)
    assert found and float(found.group(1)) < 1e-9, check
    assert check.count("expert grads") == 2  # both ranks compared their shards
    err = [o for o in _cell(nb, "found a bad shard").outputs if o.output_type == "error"]
    assert err and err[0]["ename"] == "ValueError"  # rank 1's own exception, rank 0 released from the barrier
    tb = ANSI.sub("", "\n".join(err[0]["traceback"]))
    assert "rank 1 (worker" in tb and "line 3" in tb, tb
    assert "confirmed on the expert-parallel layer" in cell_text(_cell(nb, "summary = summaries[0]"))
    chart = _chart(nb, "moe-ep")  # per run: the heatmap over all experts of all ranks, and the per-step lines
    heatmaps = chart["vectors"]["tokens_per_expert"]
    assert len(heatmaps) == 2
    for key, heat in heatmaps.items():
        assert len(heat["rows"]) == 200 and all(len(row) == 8 for row in heat["rows"]), key
    for name in ("loss", "aux_loss", "dropped_tokens", "a2a_ms", "tokens_per_s"):
        assert len(chart["scalars"][name]) == 2, name
    scaling = cell_text(_cell(nb, "for n in RANK_COUNTS"))
    assert re.search(r"\b1 rank: [\d,]+ tokens/s", scaling) and re.search(r"\b2 ranks: [\d,]+ tokens/s", scaling), (
        scaling
    )
