"""Configuration through ``dask.config`` under the ``jupyter-cluster`` namespace.

Every default lives in ``jupyter-cluster.yaml`` beside this module.  Users and
administrators override them the Dask way: a YAML file in ``~/.config/dask/`` or
environment variables such as ``DASK_JUPYTER_CLUSTER__BACKEND=kubernetes``.
"""

from __future__ import annotations

import os
from typing import Any

import dask.config
import yaml

NAMESPACE = "jupyter-cluster"

_defaults_file = os.path.join(os.path.dirname(__file__), "jupyter-cluster.yaml")
with open(_defaults_file) as _f:
    # libyaml's safe loader when PyYAML has it: the same result, 8x faster (every worker process reads this)
    defaults = yaml.load(_f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))

dask.config.update_defaults(defaults)


def get(key: str, default: Any = None) -> Any:
    """Return ``jupyter-cluster.<key>`` from dask.config.

    Parameters
    ----------
    key : str
        Dotted key below the ``jupyter-cluster`` namespace, e.g. ``"local.threads"``.
    default : object, optional
        Returned when the key is not set anywhere.
    """
    return dask.config.get(f"{NAMESPACE}.{key}", default)


def timeout_seconds(key: str) -> float:
    """Read a duration setting ("10s", 5, "1 minute") as seconds."""
    from dask.utils import parse_timedelta

    return float(parse_timedelta(get(key)))
