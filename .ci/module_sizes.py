"""`make lint`'s size check: no package module over the line limit, except those allowed with a reason.

The limit and the allowlist are in pyproject.toml, ``[tool.jupyter-cluster.module-size]``: one job per
module is easier to keep when a module that grows past it has to say why.
"""

from __future__ import annotations

import os
import sys

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        settings = tomllib.load(f)["tool"]["jupyter-cluster"]["module-size"]
    limit, allowed = settings["max-lines"], settings.get("allow", {})
    over = {}
    for folder, _, files in os.walk(os.path.join(ROOT, "jupyter_cluster")):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    lines = sum(1 for _ in f)
                if lines > limit:
                    over[os.path.relpath(path, ROOT)] = lines
    failed = sorted(set(over) - set(allowed))
    for path in failed:
        print(
            f"{path}: {over[path]} lines, over the {limit}-line limit; split it along its jobs, or add it with a reason "
            "to [tool.jupyter-cluster.module-size] allow in pyproject.toml."
        )
    for path in sorted(set(allowed) - set(over)):
        print(
            f"{path} is allowed over {limit} lines but is not (any more): remove it from the allowlist in pyproject.toml."
        )
        failed.append(path)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
