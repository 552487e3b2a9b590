"""What is done about a cluster whose owner died: a clean-up hook per backend.

The registry (a low layer) finds the record of a cluster whose owner process
has died (a ``kill -9`` of its kernel), removes it and calls the hook of the
backend the record names: cancel its batch jobs, stop its dask-gateway cluster.
It never imports a backend.  A hook is named like an entry point,
``"module:function"``, so a process that never imported the backend (a new
kernel, the Jupyter server) still runs it; the record only chooses *which*
registered hook, by its backend's name: nothing read from disk is imported or run.

Another package's backend registers its own hook with :func:`register`, or under
the ``jupyter_cluster.orphan_hooks`` entry-point group (so that a fresh process
finds it too).  A hook is called with the dead owner's record
(:class:`jupyter_cluster.state.registry.ClusterRecord`) and must return quickly.
"""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

Hook = Callable[[Any], None]

ENTRY_POINT_GROUP = "jupyter_cluster.orphan_hooks"

_BATCH = "jupyter_cluster.backends.jobqueue:cleanup_orphan"

#: backend name -> its hook, a callable or ``"module:function"``; a backend not here has none (or
#: one under the entry-point group): a local cluster's workers die with their owner (its socket and
#: credentials are the registry's own to remove), an attached one is not ours to stop
_HOOKS: dict[str, Hook | str | None] = {
    "gateway": "jupyter_cluster.backends.gateway:cleanup_orphan",
    "slurm": _BATCH,
    "pbs": _BATCH,
    "sge": _BATCH,
    "lsf": _BATCH,
}


def register(backend: str, hook: Hook | str | None) -> None:
    """Register ``hook`` (a callable or ``"module:function"``) as what backend ``backend`` does for a dead owner's cluster."""
    _HOOKS[backend] = hook


@functools.cache
def _entry_points() -> dict[str, Any]:
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def hook_for(backend: object) -> Hook | None:
    """The clean-up hook registered for ``backend`` (a record's backend name), or None."""
    if not isinstance(backend, str):
        return None
    if backend in _HOOKS:
        hook = _HOOKS[backend]
    else:
        ep = _entry_points().get(backend)
        hook = ep.load() if ep is not None else None
    if isinstance(hook, str):
        module, _, name = hook.partition(":")
        hook = getattr(importlib.import_module(module), name)
    return hook


def clean_up(record: Any) -> None:
    """Run the hook of ``record``'s backend, if it has one; a failing hook is logged, never raised.

    The caller is listing clusters (``%cluster list``, the panel's server): a
    backend that cannot clean up must not break that.
    """
    try:
        hook = hook_for(getattr(record, "backend", None))
        if hook is not None:
            hook(record)
    except Exception:
        logger.debug("clean-up of %r failed", getattr(record, "name", None), exc_info=True)
