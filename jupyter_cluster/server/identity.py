"""Which cluster an action from the panel means: the one it showed (its id), never a later one of that name.

A cluster's name is a label that a stopped cluster leaves free for the next
(another notebook's ``%cluster start --name local-1``); the panel sends the id
(:func:`jupyter_cluster.wire.models.cluster_id`) of the card it acted on.
"""

from __future__ import annotations

from typing import Any

from ..errors import ClusterError


def shown_id(holder: Any) -> str | None:
    """The id of a running (``Connection``) or kept (``KeptCluster``) cluster, or None where it has none."""
    try:
        value = holder.summary().get("id")
    except (AttributeError, TypeError):
        return None
    return value if isinstance(value, str) else None


def check_shown(manager: Any, name: str, shown: str) -> None:
    """Raise :class:`ClusterError` unless ``name`` is still the cluster of id ``shown``.

    A name the manager does not hold is left to the action (it says "no cluster").
    """
    holder = manager.connections.get(name) or manager.history.get(name)
    if holder is None:
        return
    now = shown_id(holder)
    if now is not None and now != shown:
        raise ClusterError(
            f"the cluster shown as {name!r} has stopped and another cluster now has that name; nothing was done, "
            "look at the panel again."
        )
