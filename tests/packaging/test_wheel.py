"""What the package declares against what it imports, and what its release builds are made of.

The real check of both is ``make as-installed`` (``.ci/as_installed.py``, run by CI): the wheel in a
fresh environment with no extras.  This module catches the same mistakes in seconds: a runtime
import whose distribution is not a declared dependency (``cryptography`` was not, and every
``%cluster start`` failed in a clean install), and a release build set up so that it can ship a
development build of the extension.
"""

from __future__ import annotations

import ast
import json
import os
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

from ..conftest import ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

PACKAGE = Path(ROOT) / "jupyter_cluster"

# Imports that a core install may lack, each with where it is needed; the code imports them where
# used, and the features say what to install when they are missing.
OPTIONAL = {
    "torch": "examples extra: %%spmd cells",
    "pandas": "examples/test extras: metrics() returns a DataFrame when pandas is there, else a list",
    "numpy": "comes with bokeh; telemetry's vector statistics use it when present",
    "dask_kubernetes": "kubernetes extra",
    "kr8s": "kubernetes extra",
    "httpx": "kubernetes extra (kr8s's HTTP client)",
    "dask_cuda": "GPU clusters, when installed",
    "dask_jobqueue": "hpc extra: slurm/pbs/sge/lsf backends",
    "asyncssh": "hpc extra: the ssh backend (Dask's SSHCluster)",
    "dask_gateway": "hpc extra: the gateway backend",
    "aiohttp": "hpc extra (dask-gateway's HTTP client): the gateway backend's error sentences",
}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared() -> set[str]:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    return {_normal(re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0]) for d in deps}


def _third_party_imports() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "jupyter_cluster":
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_runtime_import_is_a_declared_dependency():
    declared = _declared()
    dists = packages_distributions()
    undeclared = {}
    for module, files in sorted(_third_party_imports().items()):
        if module in OPTIONAL:
            continue
        names = {_normal(d) for d in dists.get(module, [module])}
        if not names & declared:
            undeclared[module] = sorted(files)
    assert not undeclared, (
        f"imported by the package but not in [project].dependencies of pyproject.toml: {undeclared}; "
        "declare each (or, for an optional feature, add it to OPTIONAL here with the reason)"
    )


def test_optional_imports_are_still_imported():
    # an entry left here after the code stopped importing it would hide nothing, but says something false
    assert set(OPTIONAL) <= set(_third_party_imports())


def test_release_builds_are_production_builds_whatever_was_built_before():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        hook = tomllib.load(f)["tool"]["hatch"]["build"]["hooks"]["jupyter-builder"]
    with open(os.path.join(ROOT, "package.json")) as f:
        scripts = json.load(f)["scripts"]
    assert hook["build-kwargs"]["build_cmd"] == "build:prod"
    prod = scripts["build:prod"]
    # the production script builds without --development and drops the builder's schema copy
    assert "build:labextension " in prod + " " and "--development" not in scripts["build:labextension"]
    assert prod.endswith("jlpm clean:orig") and "package.json.orig" in scripts["clean:orig"]
    # A development build (`make`, the editable install) leaves the skip file out, since every build
    # empties the output folder and only a production build writes the licence file; the release build
    # then builds again in production mode rather than shipping what it found.
    licences = "jupyter_cluster/labextension/static/third-party-licenses.json"
    assert licences in hook["skip-if-exists"]
    assert set(hook["skip-if-exists"]) <= set(hook["ensured-targets"])
    built = PACKAGE / "labextension" / "static"
    if (built / "style.js").exists() and list(built.glob("*.js.map")):  # the tree holds a development build
        assert not (built / "third-party-licenses.json").exists(), "a development build wrote the skip file"


def test_what_stays_out_of_the_release_files_is_said_without_gitignore():
    # Hatch drops every .gitignore pattern when the checkout's own path matches one (a checkout
    # under a folder named build/ shipped .yarn/, labextension/lib/ and a second extension copy).
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        targets = tomllib.load(f)["tool"]["hatch"]["build"]["targets"]
    sdist = set(targets["sdist"]["exclude"])
    assert {"node_modules", ".yarn", "labextension/lib", "*.tsbuildinfo", "/build", "/dist"} <= sdist
    assert "jupyter_cluster/labextension" in targets["wheel"]["exclude"]
