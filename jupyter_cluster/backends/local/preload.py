"""What the fork server does once, before it forks any worker: each forked worker inherits the result.

A worker that registers with the scheduler sends ``distributed.versions.get_versions()``:
package versions looked up in the installed distributions' metadata, and the
machine's ``platform.uname()`` (which runs ``uname -p``).  Both are cached per
process, so a worker forked after this import skips them (about 40 % of a
forked worker's CPU before it registered, measured with py-spy on 2 cores).

Tornado makes its default client TLS context (the system's CA store, about
0.1 s of CPU) the first time a process accepts a TLS connection, though a
server-side stream never uses it; a local cluster's workers accept the
scheduler's and the client's connections on a first map's path.  Made here
once, on Linux only (tornado makes it lazily because on macOS loading the
store may start threads, which a fork would not carry).  The context is made
in a thread from the package's import on (``_core/tls_defaults.py``).

Each worker's first step (the nanny's ``WorkerProcess._run``) is
``dask.config.refresh()``, which parses the YAML files in Dask's config
folders again, in pure Python: dask-jobqueue, dask-gateway and
dask-kubernetes each write a commented file of defaults into
``~/.config/dask``, 30 ms of a forked worker's start on 2 cores.  Each
file is parsed once here and kept by path, modification time and size;
a worker forked afterwards gets a copy (a file changed since is parsed again).
"""

from __future__ import annotations

import copy
import os
import sys
from typing import Any

import dask.config
from distributed.versions import get_versions

get_versions()

# private: a Dask without it parses as it did
_parse_config_file: Any = getattr(dask.config, "_load_config_file", None)
_parsed: dict[tuple[str, int, int], Any] = {}


def _load_config_file(path: str) -> dict | None:
    try:
        st = os.stat(path)
    except OSError:
        return _parse_config_file(path)
    key = (path, st.st_mtime_ns, st.st_size)
    if key not in _parsed:
        _parsed[key] = _parse_config_file(path)
    return copy.deepcopy(_parsed[key])  # dask merges into what it gets


if callable(_parse_config_file):
    dask.config._load_config_file = _load_config_file
    list(dask.config.collect_yaml(dask.config.paths))

if sys.platform.startswith("linux"):
    from jupyter_cluster._core import tls_defaults

    tls_defaults.install()  # made in a thread since the package's import (a script's own process)
