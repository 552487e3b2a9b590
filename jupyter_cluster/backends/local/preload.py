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
store may start threads, which a fork would not carry).
"""

from __future__ import annotations

import sys

from distributed.versions import get_versions

get_versions()

if sys.platform.startswith("linux"):
    from jupyter_cluster._core import tls_defaults

    tls_defaults.install()  # made in a thread since the package's import (a script's own process)
