"""Execute the example notebooks at CI size and write their outputs in place (``make notebooks``).

A reader on GitHub or nbviewer then sees the results without running anything:
the widgets' outputs keep only their static copies (charts as SVG, the final
progress lines, the cluster table), as a notebook saved from JupyterLab does
(jupyter_cluster.widgets.static_render).  Volatile bits are stripped so that a
re-run changes little: cell timing metadata, the ports of loopback addresses.

Usage: python .ci/execute_notebooks.py [NOTEBOOK ...]   (default: notebooks/*.ipynb)
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = os.path.join(ROOT, "notebooks")

#: the environment tests/packaging/test_notebooks.py runs them in: CI size, 2 single-threaded local workers
CI_ENV = {
    "JUPYTER_CLUSTER_EXAMPLES_SIZE": "ci",
    "DASK_JUPYTER_CLUSTER__BACKEND": "local",
    "DASK_JUPYTER_CLUSTER__LOCAL__WORKERS": "2",
    "DASK_JUPYTER_CLUSTER__LOCAL__THREADS": "1",
}
#: different on every run: a loopback address's port, the owning kernel's process id in `%cluster list`
VOLATILE = [
    (re.compile(r"((?:tcp|tls|ws|wss|inproc|http)://127\.0\.0\.1):\d+"), r"\1:PORT"),
    (re.compile(r"\bkernel \d+\b"), "kernel PID"),
]


def _scrub(text: str) -> str:
    for pattern, repl in VOLATILE:
        text = pattern.sub(repl, text)
    return text


def publishable(nb) -> None:
    """Static copies only, no per-run metadata, volatile bits replaced (``nb`` changed in place)."""
    from jupyter_cluster.widgets.static_render import strip_widget_views

    nb.metadata.pop("widgets", None)
    strip_widget_views(nb)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        for out in cell.get("outputs", ()):
            if "text" in out:
                out["text"] = _scrub(out["text"])
            for mime, value in (out.get("data") or {}).items():
                if isinstance(value, str) and mime.startswith("text/"):
                    out["data"][mime] = _scrub(value)
            if out.get("output_type") == "error":
                out["traceback"] = [_scrub(line) for line in out["traceback"]]


def execute(path: str, timeout: int = 600) -> float:
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=timeout,  # per cell
        kernel_name="python3",
        resources={"metadata": {"path": os.path.dirname(path)}},
        store_widget_state=False,  # a reader gets the static copies; the widget state is megabytes of script
    )
    started = time.monotonic()
    client.execute()
    publishable(nb)
    nbformat.validate(nb)
    nbformat.write(nb, path)
    return time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", help="notebook paths (default: notebooks/*.ipynb)")
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted(glob.glob(os.path.join(NOTEBOOKS, "*.ipynb")))
    os.environ.update(CI_ENV)
    for path in paths:
        seconds = execute(os.path.abspath(path))
        size = os.path.getsize(path)
        print(f"{os.path.relpath(path, ROOT)}: executed in {seconds:.0f} s, {size / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
