"""Which run (and ``%%parallel`` item) the code on this thread belongs to, and a record's tag.

A leaf module (the standard library only): :mod:`jupyter_cluster.tracking` sets
the state here (a ``with jc.run(...)`` block, a map's function called as a
:class:`~jupyter_cluster.tracking.context.RunCall`, a sweep item's
:meth:`~jupyter_cluster.tracking.tags.ItemTag.enter`), and the report producer
(:mod:`jupyter_cluster.telemetry.producer`, on every worker) reads it through
:func:`tag_record`.  Runs sit above telemetry (they publish on its topics), so
the producer must not import them: this is what both need.
"""

from __future__ import annotations

import contextvars
import math
import sys
import threading
from collections.abc import Mapping
from typing import Any, Protocol

#: config entries per item or run
MAX_CONFIG_KEYS = 64
#: characters of a config value that is not a number, bool or short string (its repr, clipped)
MAX_VALUE_TEXT = 120


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- configs ------------------------------------------------------------------------
def config_value(v: Any) -> Any:
    """``v`` as a config cell holds it: a number, bool, None or short string; anything else its clipped repr."""
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, int):
        return v if -(2**63) <= v < 2**64 else float(v)
    if isinstance(v, float):
        return v if math.isfinite(v) else str(v)
    if isinstance(v, str):
        return _clip(v, MAX_VALUE_TEXT)
    shape = getattr(v, "shape", None)
    if shape is not None and tuple(shape) == () and hasattr(v, "item"):  # numpy / torch scalars
        try:
            return config_value(v.item())
        except Exception:
            pass
    try:
        text = repr(v)
    except Exception:
        text = f"<{type(v).__name__}>"
    return _clip(text, MAX_VALUE_TEXT)


def clean_config(config: Any, what: str = "config") -> dict[str, Any]:
    """A checked copy of a user's ``config=``: string keys, values as :func:`config_value` keeps them.

    Raises
    ------
    TypeError
        When ``config`` is not a mapping with string keys, or has too many entries.
    """
    if config is None:
        return {}
    if not isinstance(config, Mapping):
        raise TypeError(f"{what} must be a dict of hyperparameters such as {{'lr': 0.1}}, not {type(config).__name__}.")
    if len(config) > MAX_CONFIG_KEYS:
        raise TypeError(f"{what} has {len(config)} entries; at most {MAX_CONFIG_KEYS} are kept per run or item.")
    out: dict[str, Any] = {}
    for k, v in config.items():
        if not isinstance(k, str) or not k or len(k) > 200:
            raise TypeError(f"{what} keys must be non-empty strings of at most 200 characters, not {k!r:.40}.")
        out[k] = config_value(v)
    return out


# -- the state: set by jupyter_cluster.tracking ------------------------------------------
class NamedRun(Protocol):
    """What a record's tag needs of a :class:`jupyter_cluster.tracking.context.Run`."""

    id: str

    def add_config(self, config: Mapping[str, Any]) -> None: ...


#: the innermost ``with jc.run(...)`` block (a :class:`jupyter_cluster.tracking.context.Run`), in the kernel
_active: contextvars.ContextVar[Any] = contextvars.ContextVar("jupyter_cluster_run", default=None)
#: The ``%%parallel`` item running in this thread: ``item_state.ctx`` is ``[its run's tag, the item,
#: the id of the item's namespace, its (key, config) once a report asked (False: unreadable)]``
#: while the worker runs the item's cell, None otherwise
#: (:meth:`jupyter_cluster.engine.worker.run.PreparedCell.bind` sets it around the cell: a
#: thread-local set and cleared inline costs 0.14 us per item, a context manager 0.5).  The
#: item's key and config are worked out once, when a report first asks (most items of a large
#: map report nothing), and nothing here outlives the item.
item_state = threading.local()
#: the named run whose map's function this worker thread is running (set by RunCall)
_call = threading.local()


def active_run() -> Any:
    """The innermost ``with jc.run(...)`` block this code is in (a :class:`jupyter_cluster.tracking.context.Run`), or None."""
    return _active.get()


def current_item() -> tuple[str, str, dict[str, Any]] | None:
    """``(run, item key, item config)`` of the ``%%parallel`` item running in this thread, or None.

    It holds while the item's cell is on this thread's stack (``report()``
    called from the cell or anything below it) and lapses at the item's end
    (:data:`item_state`).  A thread the item starts is not tagged, nor is an
    item whose config cannot be read.
    """
    ctx = getattr(item_state, "ctx", None)
    if ctx is None:
        return None
    tag, item, namespace_id, described = ctx
    # Only code of the item's own cell, or called from it, is the item's (its namespace is alive
    # while the item runs, so its id is its own).
    frame: Any = sys._getframe(1)
    while frame is not None:
        if id(frame.f_globals) == namespace_id:
            if described is None:
                try:
                    described = ctx[3] = tag.key_and_config(item)
                except Exception:  # an item whose config cannot be read runs untagged
                    described = ctx[3] = False
            if described is False:
                return None
            return tag.run, described[0], described[1]
        frame = frame.f_back
    return None


def tag_record(record: dict[str, Any], config: Mapping[str, Any] | None) -> None:
    """Say in a ``report()`` record which run (and ``%%parallel`` item) it belongs to, and its ``config=``.

    Raises
    ------
    TypeError
        When ``config`` is not a dict of hyperparameters (before anything is sent).
    """
    cfg = clean_config(config, "report(config=...)") if config is not None else None
    found = current_item()
    call_run = getattr(_call, "run", None)
    if found is not None:
        record["run"], record["item"] = found[0], found[1]
    elif call_run is not None:  # on a worker, in a map made inside a named run
        record["run"], record["item"] = call_run, ""
    else:
        named: NamedRun | None = _active.get()
        if named is not None:
            record["run"], record["item"] = named.id, ""
            if cfg:
                named.add_config(cfg)
    if cfg:
        record["config"] = cfg
