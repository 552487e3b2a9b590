"""The IPython magics: ``%cluster``, ``%%parallel``, ``%%spmd``.

- :mod:`.cluster_magic`: ``%cluster`` (start, connect, list, scale, stop, metrics);
- :mod:`.parallel_magic`: ``%%parallel`` (header, options, ``--out``);
- :mod:`.spmd_magic`: ``%%spmd`` / ``%spmd``;
- :mod:`.args`: the argument parsing they share;
- :mod:`.tracebacks`: workers' errors rebuilt at the cell's lines.

Each magic only parses its line and calls the layers below; every
:class:`~jupyter_cluster.errors.ClusterError` becomes a one-sentence ``UsageError``.
"""

from __future__ import annotations

from .cluster_magic import ClusterMagics
from .parallel_magic import ParallelMagics
from .spmd_magic import SpmdMagics

__all__ = ["ClusterMagics", "ParallelMagics", "SpmdMagics", "register_magics"]


def register_magics(ipython) -> None:
    """Register every jupyter_cluster magic on ``ipython``."""
    ipython.register_magics(ClusterMagics)
    ipython.register_magics(SpmdMagics)
    ipython.register_magics(ParallelMagics)
