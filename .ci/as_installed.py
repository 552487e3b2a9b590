"""The product as users get it: release builds, a wheel installed without Node.js, real kernels.

Run by ``.ci/run`` (through ``make as-installed``) before the test suite, and by hand::

    .venv/bin/python .ci/as_installed.py [--workdir build/as-installed] [--source DIR]
                                         [--no-examples | --examples-without-torch] [--wheel WHEEL]

1. Copies the source tree (tracked and untracked files git does not ignore, plus whatever
   extension build and ``node_modules`` lie there: a release build must not ship a development
   build that was there before) and builds the sdist with ``python -m build``, then the wheel
   from that sdist with no Node.js on PATH (the sdist carries the production build).
2. Checks the wheel holds a production build of the extension: no ``.js.map``, no
   ``package.json.orig``, no development chunk, the licence file a production build writes.
3. Installs the wheel with no extras into a fresh virtual environment and, with no Node.js on
   PATH, checks that ``jupyter labextension list`` and ``jupyter server extension list`` show the
   extension enabled, then drives a real kernel of that environment (nbclient, from the
   environment running this script) through ``%load_ext jupyter_cluster``, ``%cluster start``, a
   ``%%parallel`` cell, ``Pool.map``, ``report()`` + ``metrics()`` and ``%cluster stop``.
4. Installs the wheel with ``[examples]`` into a second fresh environment and runs
   ``notebooks/01-quickstart.ipynb`` there (CI size). PyTorch with its CUDA libraries is 5.2 GB
   of that environment's 5.9 GB and 01 does not import it: ``--examples-without-torch`` installs
   the extra's other libraries only, for a machine where that download is too slow (the install
   took 69 s on a quiet machine, 604 s at load 15).

Every step prints how long it took and the environments' sizes; any failure exits non-zero with
the step's output.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NODE_TOOLS = {"node", "nodejs", "npm", "npx", "yarn", "yarnpkg", "corepack", "pnpm"}
SYSTEM_DIRS = ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"]
LABEXT_IN_WHEEL = "data/share/jupyter/labextensions/jupyter-cluster/"
# The production echarts chunk is ~0.65 MB, the development one 3.1 MB (issue 25).
MAX_JS_BYTES = 1_000_000
MAX_WHEEL_BYTES = 1_500_000
ANSI = re.compile(r"\x1b\[[0-9;]*m")


class CheckFailed(Exception):
    """One step of the check failed; the message says which and why."""


def step(title: str):
    print(f"\n== {title}", flush=True)
    return time.monotonic()


def done(start: float, what: str = "done") -> float:
    took = time.monotonic() - start
    print(f"   {what} in {took:.1f} s", flush=True)
    return took


def run(cmd: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 1800) -> str:
    """Run ``cmd``; its output (stdout and stderr together) or CheckFailed with the output's tail."""
    proc = subprocess.run(
        cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout
    )
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.splitlines()[-60:])
        raise CheckFailed(f"`{' '.join(cmd)}` exited {proc.returncode}:\n{tail}")
    return proc.stdout


def du(path: Path) -> str:
    """``du -sh``'s figure, the one the README quotes."""
    return subprocess.run(["du", "-sh", str(path)], capture_output=True, text=True, check=True).stdout.split()[0]


def nodeless_bin(work: Path) -> Path:
    """A folder of links to the system's programs, Node.js and its package managers left out."""
    shim = work / "bin-without-node"
    shim.mkdir(parents=True, exist_ok=True)
    for d in SYSTEM_DIRS:
        if not os.path.isdir(d):
            continue
        for name in os.listdir(d):
            target = os.path.join(d, name)
            if name in NODE_TOOLS or (shim / name).exists() or not os.access(target, os.X_OK):
                continue
            if os.path.isdir(target):
                continue
            os.symlink(target, shim / name)
    return shim


def clean_env(work: Path, path: str) -> dict[str, str]:
    """The environment of a user's shell: no PYTHONPATH or venv of the caller, Jupyter's own dirs empty."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(
        PATH=path,
        JUPYTER_CONFIG_DIR=str(work / "jupyter-config"),
        JUPYTER_DATA_DIR=str(work / "jupyter-data"),
        JUPYTER_RUNTIME_DIR=str(work / "jupyter-runtime"),
    )
    for key in ("JUPYTER_PATH", "JUPYTER_CONFIG_PATH", "MAKEFLAGS", "MAKELEVEL", "MFLAGS"):
        env.pop(key, None)
    return env


# -- 1. release builds ------------------------------------------------------------------------
def copy_source(source: Path, dest: Path) -> None:
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=source,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for raw in files:
        if not raw:
            continue
        rel = raw.decode()
        src = source / rel
        if not src.is_file():  # deleted in the working tree
            continue
        if (source / rel.split("/", 1)[0] / "pyvenv.cfg").exists():  # a virtual environment git does not ignore
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel)
    # Ignored, but what a developer's tree holds after `make`: the development build of the
    # extension (which the release build must replace) and the JavaScript packages (so jlpm need
    # not fetch them again).
    for rel in ("jupyter_cluster/labextension", "jupyter_cluster/widgets/static", "node_modules", ".yarn"):
        if (source / rel).is_dir():
            shutil.copytree(source / rel, dest / rel, symlinks=True, dirs_exist_ok=True)


def build(source: Path, work: Path, nodeless_path: str) -> tuple[Path, Path]:
    t = step(f"copy {source} and build the sdist (python -m build --sdist)")
    src = work / "src"
    copy_source(source, src)
    dist = work / "dist"
    dev_build = (src / "jupyter_cluster/labextension/static").is_dir() and not (
        src / "jupyter_cluster/labextension/static/third-party-licenses.json"
    ).exists()
    print(f"   the copied tree holds {'a development' if dev_build else 'no development'} build of the extension")
    run([sys.executable, "-m", "build", "--sdist", "--outdir", str(dist), str(src)], cwd=src)
    (sdist,) = dist.glob("*.tar.gz")
    done(t)

    t = step("build the wheel from the sdist, no Node.js on PATH")
    unpacked = work / "sdist"
    with tarfile.open(sdist) as tar:
        # the "data" filter where this Python has it (3.10.12+, 3.11.4+): no links out of the folder
        if hasattr(tarfile, "data_filter"):
            tar.extractall(unpacked, filter="data")
        else:  # pragma: no cover - older interpreters
            tar.extractall(unpacked)  # noqa: S202 - our own sdist, just built
    (top,) = unpacked.iterdir()
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{nodeless_path}")
    run([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(top)], env=env, cwd=top)
    (wheel,) = dist.glob("*.whl")
    done(t)
    return sdist, wheel


def check_release_files(sdist: Path, wheel: Path) -> list[str]:
    """What is wrong with the release files (empty when nothing is): the install goes on regardless."""
    t = step("the wheel and the sdist hold a production build of the extension")
    with zipfile.ZipFile(wheel) as zf:
        infos = zf.infolist()
    names = [i.filename for i in infos]
    labext = [i for i in infos if LABEXT_IN_WHEEL in i.filename]
    problems = []
    if not labext:
        problems.append("no share/jupyter/labextensions/jupyter-cluster files")
    for info in labext:
        rel = info.filename.split(LABEXT_IN_WHEEL, 1)[1]
        if rel.endswith(".map") or rel.endswith(".orig") or rel == "build_log.json":
            problems.append(f"{rel} (a development or build-time file)")
        if rel.endswith(".js") and info.file_size > MAX_JS_BYTES:
            problems.append(f"{rel} is {info.file_size / 1e6:.1f} MB (an unminified development chunk?)")
    for needed in ("static/third-party-licenses.json", "static/style.js", "package.json", "install.json"):
        if not any(i.filename.endswith(LABEXT_IN_WHEEL + needed) for i in labext):
            problems.append(f"{needed} missing (the licence file is written by production builds only)")
    for needed in (
        "jupyter_cluster/widgets/static/metrics.js",
        "data/etc/jupyter/jupyter_server_config.d/jupyter_cluster.json",
    ):
        if not any(n.endswith(needed) for n in names):
            problems.append(f"{needed} missing")
    if any(n.startswith("jupyter_cluster/labextension/") for n in names):
        problems.append("the package folder holds a second copy of the extension (it belongs under share/ only)")
    size = wheel.stat().st_size
    if size > MAX_WHEEL_BYTES:
        problems.append(f"the wheel is {size / 1e6:.2f} MB (a production one is ~0.7 MB)")
    with tarfile.open(sdist) as tar:
        members = tar.getnames()
    for bad in ("/node_modules/", "/.venv", "/.yarn/", "/labextension/lib/", ".tsbuildinfo/", "/build/", "/dist/"):
        if any(bad in m + "/" for m in members):
            problems.append(f"the sdist ships {bad.strip('/')}")
    if not any(m.endswith("jupyter_cluster/labextension/static/third-party-licenses.json") for m in members):
        problems.append("the sdist has no production build of the extension (a wheel from it would need Node.js)")
    js = sum(i.file_size for i in labext if i.filename.endswith(".js"))
    print(f"   wheel {wheel.name}: {size / 1e6:.2f} MB, {len(names)} files, extension JS {js / 1e6:.2f} MB")
    print(f"   sdist {sdist.name}: {sdist.stat().st_size / 1e6:.2f} MB")
    for problem in problems:
        print(f"   FAILED: {problem}")
    done(t)
    return [f"release build: {p}" for p in problems]


# -- 2. installs ------------------------------------------------------------------------------
def extra_requirements(wheel: Path, extra: str) -> list[str]:
    """The requirements of one extra, as the wheel's metadata lists them."""
    from email.parser import HeaderParser

    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as zf:
        (meta,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        headers = HeaderParser().parsestr(zf.read(meta).decode())
    found = []
    for line in headers.get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.marker is not None and "extra" in str(req.marker) and req.marker.evaluate({"extra": extra}):
            req.marker = None
            found.append(str(req))
    return found


def make_venv(work: Path, name: str, *requirements: str) -> Path:
    t = step(f"fresh environment {name}: pip install {' '.join(repr(r) for r in requirements)}")
    venv = work / name
    # The base interpreter, not this script's virtual environment: nothing of the latter leaks in.
    base = getattr(sys, "_base_executable", sys.executable)
    run([base, "-m", "venv", str(venv)])
    run([str(venv / "bin/python"), "-m", "pip", "install", "--quiet", *requirements])
    took = done(t, "installed")
    print(f"   {name}: {du(venv)} on disk (du -sh), installed in {took:.0f} s")
    return venv


def check_extension_lists(venv: Path, env: dict[str, str]) -> None:
    t = step(f"{venv.name}: jupyter labextension list / jupyter server extension list")
    lab = ANSI.sub("", run([str(venv / "bin/jupyter"), "labextension", "list"], env=env))
    server = ANSI.sub("", run([str(venv / "bin/jupyter"), "server", "extension", "list"], env=env))
    if not re.search(r"jupyter-cluster v\S+ enabled\s+OK", lab):
        raise CheckFailed(f"`jupyter labextension list` does not show jupyter-cluster enabled and OK:\n{lab}")
    if not (re.search(r"jupyter_cluster\s+enabled", server) and re.search(r"jupyter_cluster \S+ OK", server)):
        raise CheckFailed(f"`jupyter server extension list` does not show jupyter_cluster enabled and OK:\n{server}")
    for line in (lab + server).splitlines():
        if "jupyter-cluster" in line or "jupyter_cluster" in line:
            print("   " + line.strip())
    done(t)


def run_notebook(venv: Path, work: Path, env: dict[str, str], nb, label: str, cwd: Path, timeout: int = 600) -> None:
    """Execute ``nb`` in a kernel of ``venv``'s own Python (its ipykernel), driven by nbclient."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    kernels = work / "kernels"
    spec_dir = kernels / f"as-installed-{venv.name}"
    spec_dir.mkdir(parents=True, exist_ok=True)
    spec = {
        "argv": [str(venv / "bin/python"), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"as installed ({venv.name})",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    t = step(f"{venv.name}: {label} in a real kernel of that environment")
    ksm = KernelSpecManager(kernel_dirs=[str(kernels)])
    km = KernelManager(kernel_name=spec_dir.name, kernel_spec_manager=ksm)
    # The kernel gets exactly the user's environment (no Node.js, the venv's Jupyter dirs).
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        client = NotebookClient(
            nb, km=km, timeout=timeout, startup_timeout=180, resources={"metadata": {"path": str(cwd)}}
        )
        try:
            client.execute()
        except Exception as exc:
            text = ANSI.sub("", str(exc)).strip().splitlines()
            raise CheckFailed(f"{label} failed in {venv.name}'s kernel:\n" + "\n".join(text[-40:])) from None
    finally:
        os.environ.clear()
        os.environ.update(saved)
        # nbclient shuts down only the kernels it started itself, not one handed to it as km
        if km.has_kernel:
            km.shutdown_kernel()
    stderr = [
        "".join(o.get("text", ""))
        for c in nb.cells
        for o in c.get("outputs", [])
        if o.get("output_type") == "stream" and o.get("name") == "stderr"
    ]
    noisy = [s for s in stderr if "Traceback" in s]
    if noisy:
        print(f"   note: {len(noisy)} cell(s) printed a traceback on stderr, e.g.:\n{noisy[0][:800]}")
    done(t)


CORE_CELLS = [
    # what a core install holds, and what it does not
    """import importlib.util, shutil, sys
assert sys.prefix == {prefix!r}, sys.prefix
assert shutil.which("node") is None, shutil.which("node")
missing = [m for m in ("pytest", "playwright", "ruff", "mypy", "torch", "kr8s") if importlib.util.find_spec(m)]
assert not missing, missing
HAVE_PANDAS = importlib.util.find_spec("pandas") is not None
print(sys.executable, "pandas" if HAVE_PANDAS else "no pandas")""",
    """%load_ext jupyter_cluster
import jupyter_cluster as jc
%cluster start --workers 2""",
    """%%parallel x in range(20) --out squares
x * x""",
    "assert squares == [x * x for x in range(20)], squares",
    """def cube(v):
    return v ** 3

with jc.Pool() as pool:
    cubes = pool.map(cube, range(10))
assert cubes == [v ** 3 for v in range(10)], cubes""",
    """def measured(i):
    jc.report(step=i, topic="as-installed", value=i * 0.5)
    return i

assert jc.map(measured, range(8)) == list(range(8))
rows = jc.metrics("as-installed")
values = sorted(rows["value"]) if HAVE_PANDAS else sorted(r["value"] for r in rows)
assert values == [i * 0.5 for i in range(8)], rows
print(type(rows).__name__, len(rows), "rows")""",
    "%cluster stop",
    """from jupyter_cluster.errors import ClusterError
try:
    jc.stop()
except ClusterError as exc:
    print("after stop:", exc)
else:
    raise AssertionError("a cluster was still running after %cluster stop")""",
]


def core_notebook(venv: Path):
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src.replace("{prefix!r}", repr(str(venv)))) for src in CORE_CELLS]
    return nb


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--workdir", default=str(ROOT / "build/as-installed"), help="scratch folder (emptied first)")
    parser.add_argument("--source", default=str(ROOT), help="the source tree to build (default: this checkout)")
    parser.add_argument("--no-examples", action="store_true", help="skip the [examples] install and notebook 01")
    parser.add_argument(
        "--examples-without-torch",
        action="store_true",
        help="install the examples extra's other libraries only (notebook 01 does not use PyTorch, 5 GB with CUDA)",
    )
    parser.add_argument("--wheel", help="check this wheel (and the .tar.gz beside it) instead of building them")
    args = parser.parse_args(argv)
    work = Path(args.workdir).resolve()
    source = Path(args.source).resolve()
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    started = time.monotonic()
    shim = nodeless_bin(work)
    failures: list[str] = []
    try:
        if args.wheel:
            wheel = Path(args.wheel).resolve()
            (sdist,) = wheel.parent.glob("*.tar.gz")
        else:
            sdist, wheel = build(source, work, str(shim))
        failures += check_release_files(sdist, wheel)

        core = make_venv(work, "core", str(wheel))
        env = clean_env(work, f"{core / 'bin'}:{shim}")
        if shutil.which("node", path=env["PATH"]):
            raise CheckFailed("Node.js is still on the PATH meant to have none")
        check_extension_lists(core, env)
        run_notebook(core, work, env, core_notebook(core), "the core walk-through", cwd=work)

        if not args.no_examples:
            import nbformat

            if args.examples_without_torch:
                from packaging.requirements import Requirement

                reqs = [r for r in extra_requirements(wheel, "examples") if Requirement(r).name != "torch"]
                examples = make_venv(work, "examples", str(wheel), *reqs)
            else:
                examples = make_venv(work, "examples", f"{wheel}[examples]")
            env = clean_env(work, f"{examples / 'bin'}:{shim}")
            env["JUPYTER_CLUSTER_EXAMPLES_SIZE"] = "ci"
            check_extension_lists(examples, env)
            nb = nbformat.read(source / "notebooks/01-quickstart.ipynb", as_version=4)
            run_notebook(examples, work, env, nb, "notebooks/01-quickstart.ipynb", cwd=source / "notebooks")
    except (CheckFailed, subprocess.TimeoutExpired) as exc:
        failures.append(str(exc))
    if failures:
        print(f"\nAS-INSTALLED CHECK FAILED after {time.monotonic() - started:.0f} s:", flush=True)
        for failure in failures:
            print(f"- {failure}")
        return 1
    print(f"\nas-installed check passed in {time.monotonic() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
