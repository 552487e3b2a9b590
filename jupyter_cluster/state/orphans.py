"""What is done about a cluster whose owner died: its backend's clean-up, asked through one installed hook.

The registry (a low layer) finds the record of a cluster whose owner process
has died (a ``kill -9`` of its kernel), removes it and calls the hook installed
here with the record.  The registry never imports a backend: the backends'
package (a higher layer) installs its look-up when it is imported
(:func:`jupyter_cluster.backends.cleanup_orphan`), which asks the backend the
record names (``Backend.cleanup_orphan``: cancel its batch jobs, stop its
dask-gateway cluster).  The record only chooses *which* registered backend:
nothing read from disk is imported or run.

A process that has not imported the backends yet (a new kernel, the Jupyter
server, anything that only read the registry) imports that one package by its
name when it first meets a dead owner's record, which installs the hook: the
lower layer names the package that serves it, never a backend.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

Hook = Callable[[Any], None]

#: the package that installs the hook when imported (a higher layer, so imported by name, when needed)
INSTALLER = "jupyter_cluster.backends"

_hook: Hook | None = None


def install(hook: Hook) -> None:
    """Install ``hook``, called with each dead owner's record (:class:`~jupyter_cluster.state.registry.ClusterRecord`)."""
    global _hook
    _hook = hook


def clean_up(record: Any) -> None:
    """Run the installed hook for ``record``; a failing hook is logged, never raised.

    The caller is listing clusters (``%cluster list``, the panel's server): a
    backend that cannot clean up must not break that.
    """
    try:
        if _hook is None:
            importlib.import_module(INSTALLER)  # installs it
        if _hook is not None:
            _hook(record)
    except Exception:
        logger.debug("clean-up of %r failed", getattr(record, "name", None), exc_info=True)
