"""What the fork server does once, before it forks any worker: each forked worker inherits the result.

A worker that registers with the scheduler sends ``distributed.versions.get_versions()``:
package versions looked up in the installed distributions' metadata, and the
machine's ``platform.uname()`` (which runs ``uname -p``).  Both are cached per
process, so a worker forked after this import skips them (about 40 % of a
forked worker's CPU before it registered, measured with py-spy on 2 cores).
"""

from __future__ import annotations

from distributed.versions import get_versions

get_versions()
