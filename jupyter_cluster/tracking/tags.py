"""The tag a ``%%parallel`` cell's items carry to the workers, and the tap that notes their configs.

An item is known on the workers by its *key* (its config as ``"lr=0.1, mom=0.9"``),
not by its index, which the engine does not hand to the cell: two items of one
run with equal configs share their metrics.  The tag's state on the workers and
the config cleaning live in :mod:`jupyter_cluster.telemetry.tags`, which the report
producer reads without importing this package.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from ..telemetry.tags import MAX_CONFIG_KEYS, _active, _clip, config_value

#: item configs (and states) a run keeps and publishes, and about how many bytes of them; the rest
#: of a long map is counted only
MAX_ITEMS = 2000
MAX_ITEMS_BYTES = 512_000


def target_names(targets: str | None) -> list[Any] | None:
    """The structure of ``%%parallel`` targets: ``"lr, mom"`` -> ``["lr", "mom"]``, ``"cfg"`` -> ``"cfg"``.

    Nested tuples give nested lists; a starred or other target gives None (the item is then one value).
    """
    if not targets:
        return None
    import ast

    try:
        node = ast.parse(f"{targets} = None").body[0]
    except SyntaxError:
        return None
    if not isinstance(node, ast.Assign):
        return None

    def walk(t: ast.AST) -> Any:
        if isinstance(t, ast.Name):
            return t.id
        if isinstance(t, (ast.Tuple, ast.List)):
            parts = [walk(e) for e in t.elts]
            return None if any(p is None for p in parts) else parts
        return None

    return walk(node.targets[0])


def item_config(structure: Any, item: Any) -> dict[str, Any]:
    """The config of one ``%%parallel`` item: a dict item's entries, or the targets it binds.

    ``%%parallel cfg in grid`` with ``cfg = {"lr": .1}`` gives ``{"lr": .1}``;
    ``%%parallel lr, mom in grid`` with ``(0.1, 0.9)`` gives ``{"lr": 0.1, "mom": 0.9}``;
    ``%%parallel seed in range(9)`` with ``3`` gives ``{"seed": 3}``.
    """
    out: dict[str, Any] = {}

    def bind(s: Any, v: Any) -> None:
        if len(out) >= MAX_CONFIG_KEYS:
            return
        if isinstance(s, str):
            if isinstance(v, Mapping) and structure == s:  # the whole item is one dict: its entries
                for k, x in list(v.items())[:MAX_CONFIG_KEYS]:
                    out[str(k)] = config_value(x)
            else:
                out[s] = config_value(v)
        elif isinstance(s, list):
            try:
                values = list(v)
            except TypeError:
                values = []
            if len(values) != len(s):
                out[_clip(str(s), 60)] = config_value(v)
                return
            for sub, x in zip(s, values):
                bind(sub, x)

    if structure is None:
        out["item"] = config_value(item)
    else:
        bind(structure, item)
    return out


def config_key(config: Mapping[str, Any]) -> str:
    """The key an item is known by: ``"lr=0.1, mom=0.9"`` (sorted), a hash past 200 characters."""
    text = ", ".join(f"{k}={config[k]}" for k in sorted(config)) or "-"
    if len(text) > 200:
        text = text[:180] + "…#" + hashlib.sha1(text.encode("utf-8", "replace")).hexdigest()[:12]
    return text


class ItemTag:
    """A run's id and its targets' structure, sent with a ``%%parallel`` cell as its ``CellFunction.tag``.

    The worker runs each item's cell with
    :data:`~jupyter_cluster.telemetry.tags.item_state` set, so ``report()`` anywhere
    below the cell (any depth, any module) says which run and item a value
    belongs to (:func:`~jupyter_cluster.telemetry.tags.current_item`, which asks :meth:`describe`).
    """

    def __init__(self, run: str, targets: str | None, sweep: bool = True):
        named = _active.get()
        #: a sweep tags each report with its item; a plain map (:mod:`.sweep_kind`) with its run alone
        self.sweep = sweep
        #: inside ``with jc.run(...)`` the sweep's items are that run's items (its id, not ``run``)
        self.run = named.id if named is not None else run
        self.structure = target_names(targets)
        self.cached: tuple[Any, str, dict[str, Any]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"run": self.run, "structure": self.structure, "sweep": self.sweep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.run = state["run"]
        self.structure = state["structure"]
        self.sweep = state.get("sweep", True)
        self.cached = None

    def describe(self, item: Any) -> tuple[str, dict[str, Any]]:
        """``(key, config)`` of ``item`` (cached for the item last asked about)."""
        last = self.cached
        if last is not None and last[0] is item:
            return last[1], last[2]
        key, config = self.key_and_config(item)
        self.cached = (item, key, config)
        return key, config

    def key_and_config(self, item: Any) -> tuple[str, dict[str, Any]]:
        """``(key, config)`` of ``item``, worked out afresh (a worker keeps it per item: :func:`~jupyter_cluster.telemetry.tags.current_item`).

        A plain map's items are all its run's: ``("", {})``.
        """
        if not self.sweep:
            return "", {}
        config = item_config(self.structure, item)
        return config_key(config), config


#: sources whose items can be read again by index once the map ended (what :class:`ItemTap` notes then)
_INDEXABLE = (list, tuple, range)


class ItemTap:
    """An iterable's items as they are read, their configs noted (the first :data:`MAX_ITEMS`).

    Wraps the ``%%parallel`` iterable without changing what the engine sees:
    the same items, and the same ``len()`` where the iterable has one.  A list,
    tuple or range is handed to the engine as it is and its first items are
    described when the map ends (:meth:`noted`), off the map's way: describing
    them as they were read kept the kernel from sending the first batches
    (100,000 no-op items: 2.3-3.1 us per item against 1.5-1.8 untagged).
    Any other iterable's first items are noted as they are read; past those,
    the engine reads the user's iterator itself (no Python call per item).
    :func:`.record.job_items` counts the items from the job.
    """

    def __init__(self, iterable: Iterable, tag: ItemTag):
        self._source = iterable
        self._it: Iterator | None = None
        self.tag = tag
        self._items: list[tuple[str, dict[str, Any]]] = []
        #: what :func:`.record.job_items` found once the job ended
        self.final: dict[str, Any] | None = None

    def __len__(self) -> int:
        return len(self._source)  # type: ignore[arg-type]  # TypeError where it has none, as len() would raise

    def __iter__(self) -> Iterator:
        if self._it is None:
            source = iter(self._source)
            indexable = type(self._source) in _INDEXABLE
            plain = indexable or not self.tag.sweep  # a plain map's items are not listed
            self._it = source if plain else itertools.chain(self._head(source), source)
        return self._it

    def _head(self, source: Iterator) -> Iterator:
        for item in itertools.islice(source, MAX_ITEMS):
            self._items.append(self._describe(item))
            yield item

    def _describe(self, item: Any) -> tuple[str, dict[str, Any]]:
        try:
            return self.tag.describe(item)
        except Exception:  # an item whose config cannot be read still runs
            return ("?", {})

    def noted(self, read: int) -> list[tuple[str, dict[str, Any]]]:
        """``(key, config)`` of the first items the map read (at most :data:`MAX_ITEMS`), ``read`` of them in all."""
        source = self._source
        if type(source) in _INDEXABLE and len(self._items) < min(read, MAX_ITEMS):
            seq: Any = source
            self._items = [self._describe(seq[k]) for k in range(min(read, len(seq), MAX_ITEMS))]
        return self._items

    def release(self) -> None:
        """Let go of the user's iterable: a tap is kept after its map (:func:`.record.job_items`), its inputs are not."""
        self._source = ()
        self._it = iter(())
        self.tag.cached = None  # the describe() cache holds the last item
