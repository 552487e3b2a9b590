"""Do the notebook, the scheduler and the workers run the same package versions?

cloudpickle ships the notebook's functions by reference to their modules, and
Dask's wire protocol changes between releases, so a worker image built from a
different environment fails in ways far from the cause.  After attaching to a
cluster we did not start here, compare versions once and say so in one line.
"""

from __future__ import annotations

import warnings
from typing import Any

# What must agree for cells to run remotely (distributed's own required list,
# plus python, whose pickle/bytecode details differ between minor versions).
CHECKED = ("python", "dask", "distributed", "cloudpickle", "msgpack", "tornado", "toolz")


class VersionMismatchWarning(UserWarning):
    """The cluster runs other versions of key packages than this notebook."""


def _short(version: Any, pkg: str = "") -> str:
    text = str(version)
    if pkg == "python":  # "3.11.7.final.0": bytecode and pickle details follow major.minor only
        return ".".join(text.split(".")[:2])
    return text


def mismatches(versions: dict[str, Any]) -> list[str]:
    """Human descriptions of disagreements in a ``Client.get_versions()`` result.

    Parameters
    ----------
    versions : dict
        ``{"client": {...}, "scheduler": {...}, "workers": {addr: {...}}}`` as
        returned by :meth:`distributed.Client.get_versions`.

    Returns
    -------
    list of str
        e.g. ``["dask 2026.8.0 here, 2024.1.0 on the workers"]``; empty when all agree.
    """

    def packages(info: Any) -> dict[str, Any]:
        return (info or {}).get("packages", {}) if isinstance(info, dict) else {}

    here = packages(versions.get("client"))
    places = {"the scheduler": packages(versions.get("scheduler"))}
    worker_pkgs = [packages(w) for w in (versions.get("workers") or {}).values()]
    out = []
    for pkg in CHECKED:
        mine = here.get(pkg)
        if mine is None:
            continue
        mine = _short(mine, pkg)
        differing = []
        other = places["the scheduler"].get(pkg)
        if other is not None and _short(other, pkg) != mine:
            differing.append(f"{_short(other, pkg)} on the scheduler")
        theirs = sorted({_short(p.get(pkg, "missing"), pkg) for p in worker_pkgs} - {mine})
        if theirs:
            differing.append(f"{', '.join(theirs)} on the workers")
        if differing:
            out.append(f"{pkg} {mine} here, {' and '.join(differing)}")
    return out


def warn_on_mismatch(client: Any, name: str = "the cluster") -> list[str]:
    """Warn (one line) when ``client``'s cluster runs other key package versions.

    Never raises: a cluster that cannot report versions is not worth failing
    a connection over.  Returns the mismatches found.
    """
    try:
        found = mismatches(client.get_versions())
    except Exception:
        return []
    if found:
        warnings.warn(
            f"cluster {name!r} runs other package versions than this notebook ({'; '.join(found)}); "
            "results may fail to unpickle - use a worker image built from this environment (see docs/kubernetes.md).",
            VersionMismatchWarning,
            stacklevel=3,
        )
    return found
