"""The Makefile's entry points, read through ``make -n`` (what they would run, nothing run).

Real runs (a scratch ``LAB_VENV``, as root, ``jupyter lab`` answering on the given port; a
``.venv-bench`` with ipyparallel over a core-only ``.venv``; ``make as-installed``, which CI runs)
are too slow for the suite; these checks pin what those runs showed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from ..conftest import ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def _dry(*args: str) -> list[str]:
    # Under `make test` the parent make's variables would make this one print "Entering/Leaving
    # directory" lines and inherit its flags: run it as a top-level make.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    out = subprocess.run(
        ["make", "--no-print-directory", "-n", *args], cwd=ROOT, capture_output=True, text=True, timeout=60, env=env
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_make_lab_runs_as_root_and_takes_user_options(tmp_path):
    lines = _dry("lab", f"LAB_VENV={tmp_path}/venv", "LAB_ARGS=--port 9999 --no-browser")
    lab = [ln for ln in lines if "/bin/jupyter lab " in ln]
    assert len(lab) == 1 and lab[0].endswith("--port 9999 --no-browser")
    # Jupyter refuses to start as root without --allow-root (it died after ~3 min of set-up)
    assert ("--allow-root" in lab[0]) == (os.geteuid() == 0)


def test_peer_systems_stay_out_of_the_lab_and_test_environment(tmp_path):
    venv, bench = f"{tmp_path}/venv", f"{tmp_path}/bench"
    for target in ("lab", "test"):
        lines = "\n".join(_dry(target, f"VENV={venv}", f"LAB_VENV={tmp_path}/lab", f"BENCH_VENV={bench}"))
        assert "bench" not in lines and "ipyparallel" not in lines, target
    lines = _dry("bench", f"VENV={venv}", f"BENCH_VENV={bench}")
    installs = [ln for ln in lines if "pip install" in ln and "bench)" in ln]
    assert installs and all(ln.startswith(f"{bench}/bin/python -m pip install") for ln in installs)
    assert lines[-1].startswith(f"{bench}/bin/python benchmarks/bench_peers.py")


def test_lean_lab_installs_the_core_only_and_the_readme_says_how_to_add_examples(tmp_path):
    lines = _dry("lab", f"LAB_VENV={tmp_path}/venv", "EXTRAS=")
    assert not [ln for ln in lines if "examples" in ln or "torch" in ln]
    assert any("pip install --quiet -e . " in ln for ln in lines)
    full = "\n".join(_dry("lab", f"LAB_VENV={tmp_path}/venv"))
    assert "examples" in full
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    assert "make lab EXTRAS=" in readme
    assert '.venv-lab/bin/pip install "numpy>=1.24" "pandas>=2" "gymnasium>=0.29"' in readme
    assert 'LAB_ARGS="--port 9999' in readme


def test_the_lab_environment_holds_no_test_tools_and_the_tests_leave_it_alone(tmp_path):
    lab, dev = f"{tmp_path}/lab", f"{tmp_path}/dev"
    lines = _dry("lab", f"LAB_VENV={lab}", f"VENV={dev}")
    # everything `make lab` installs goes into the lab's environment, and only the examples extra
    assert not [ln for ln in lines if dev in ln], lines
    installs = [ln for ln in lines if "pip install" in ln]
    assert installs and all(ln.startswith(f"{lab}/bin/python -m pip install") for ln in installs), installs
    extras = [ln.rsplit("/.extra-", 1)[1] for ln in lines if ln.startswith(f"touch {lab}/.extra-")]
    assert extras == ["examples"], lines
    assert lines[-1].startswith(f"{lab}/bin/jupyter lab ")
    for target in ("test", "lint", "bench", "setup"):
        lines = _dry(target, f"LAB_VENV={lab}", f"VENV={dev}", f"BENCH_VENV={tmp_path}/bench")
        assert not [ln for ln in lines if lab in ln], (target, lines)
    test = _dry("test", f"LAB_VENV={lab}", f"VENV={dev}")
    stamps = sorted(ln.rsplit("/.extra-", 1)[1] for ln in test if ln.startswith(f"touch {dev}/.extra-"))
    assert stamps == ["examples", "kubernetes", "test"], test


def test_no_deprecated_extension_command(tmp_path):
    # `jupyter labextension develop` / `build` print a deprecation and defer to jupyter-builder
    for target in ("lab", "test", "setup"):
        lines = "\n".join(_dry(target, f"LAB_VENV={tmp_path}/lab", f"VENV={tmp_path}/dev"))
        assert "jupyter-builder develop --overwrite ." in lines, target
        assert "labextension develop" not in lines and "labextension build" not in lines, target
    with open(os.path.join(ROOT, "package.json")) as f:
        scripts = json.load(f)["scripts"]
    assert not [k for k, v in scripts.items() if "jupyter labextension" in v], scripts
    assert "jupyter-builder build" in scripts["build:labextension"]


def test_as_installed_check_runs_from_ci(tmp_path):
    lines = _dry("as-installed", f"VENV={tmp_path}/dev", f"AS_INSTALLED_DIR={tmp_path}/ai")
    assert lines[-1].rstrip() == f"{tmp_path}/dev/bin/python .ci/as_installed.py --workdir {tmp_path}/ai", lines
    with open(os.path.join(ROOT, ".ci/run")) as f:
        ci = [ln.strip() for ln in f if ln.strip() and not ln.lstrip().startswith("#")]
    setup, as_installed, test_all = (
        next(i for i, ln in enumerate(ci) if ln.startswith(f"make {goal}"))
        for goal in ("setup", "as-installed", "test-all")
    )
    # the environment first, then the as-installed check in the background beside every test ...
    assert setup < as_installed < test_all and ci[as_installed].endswith("&"), ci
    # ... and pytest's closing line printed again last, after the check's output
    assert "pytest's closing line" in ci[-3] and ci[-2].startswith("grep") and "test-all.log" in ci[-2], ci


@pytest.mark.parametrize("target", ["test", "test-all"])
def test_make_test_runs_the_linters_first(tmp_path, target):
    lines = _dry(target, f"VENV={tmp_path}/venv")
    order = [
        next(i for i, ln in enumerate(lines) if needle in ln)
        for needle in ("-m ruff check", "-m ruff format --check", "-m mypy", "jlpm lint", "-m pytest")
    ]
    assert order == sorted(order), lines
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        test_extra = f.read().split("test = [", 1)[1].split("]", 1)[0]
    assert '"ruff' in test_extra and '"mypy' in test_extra  # installed by the project's own files


def test_make_test_is_the_fast_layer_and_test_all_everything(tmp_path):
    (fast,) = [ln for ln in _dry("test", f"VENV={tmp_path}/venv") if "-m pytest" in ln]
    (full,) = [ln for ln in _dry("test-all", f"VENV={tmp_path}/venv") if "-m pytest" in ln]
    assert "--run-all" not in fast and "--run-all" in full, (fast, full)


@pytest.mark.parametrize("target", ["test", "test-all"])
def test_make_test_hands_out_the_longest_modules_first_and_says_how_long_it_took(tmp_path, target):
    (line,) = [ln for ln in _dry(target, f"VENV={tmp_path}/venv") if "-m pytest" in ln]
    # tests/conftest.py's order (LONGEST_FIRST), not pytest-xdist's (most tests first)
    assert "--dist loadfile --no-loadscope-reorder" in line, line
    # the wall time last, and pytest's exit status kept
    assert f'echo "make {target}: ' in line and line.rstrip().endswith("exit $status"), line
    assert 0 <= time.time() - int(line.split("$(date +%s) - ", 1)[1].split(" ", 1)[0]) < 600, line


def test_opt_in_layers_are_skipped_unless_asked(tmp_path):
    # a real pytest run over a small test file: the conftest's opt-in layers, not the markers' mere presence
    (tmp_path / "conftest.py").write_text(open(os.path.join(ROOT, "tests", "conftest.py")).read())
    (tmp_path / "test_layers.py").write_text(
        "import pytest\n"
        "def test_fast(): pass\n"
        "@pytest.mark.slow\ndef test_slow(): pass\n"
        "@pytest.mark.browser\ndef test_browser(): pass\n"
    )

    def run(*flags):
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-p",
                "no:randomly",
                *flags,
                str(tmp_path),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        ).stdout
        return out.strip().splitlines()[-1]

    assert "1 passed, 2 skipped" in run(), run()
    assert "2 passed, 1 skipped" in run("--run-slow"), run("--run-slow")
    assert "3 passed" in run("--run-all"), run("--run-all")
