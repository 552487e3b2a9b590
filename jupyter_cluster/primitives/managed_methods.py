"""Which methods of a manager's shared objects may run on the scheduler: one table for both sides.

The proxies (:mod:`.manager`, client side) forward these names, and the
scheduler plugin (:mod:`.shared_store`) runs no other method of the object it
keeps.  No import of ``distributed`` here, so that either side can use it.
"""

from __future__ import annotations

#: the methods each kind of proxy forwards as they are (``proxy.keys()`` runs ``obj.keys()`` there)
FORWARDED: dict[str, tuple[str, ...]] = {
    "dict": (
        "__getitem__", "__setitem__", "__delitem__", "__contains__", "__len__", "get", "keys", "values",
        "items", "update", "pop", "popitem", "setdefault", "clear", "copy",
    ),
    "list": (
        "__getitem__", "__setitem__", "__delitem__", "__contains__", "__len__", "append", "extend", "insert",
        "pop", "remove", "index", "count", "reverse", "sort", "clear", "copy",
    ),
    "namespace": (),
    "value": (),
}  # fmt: skip

#: allowed besides: what the proxies' own methods call (``str(proxy)``, ``ns.x``, ``value.value``,
#: ``lst *= 2``) and the operators ``multiprocessing``'s proxies expose to ``_callmethod``
ALSO_ALLOWED: dict[str, tuple[str, ...]] = {
    "dict": ("__repr__", "__eq__"),
    "list": ("__repr__", "__iadd__", "__imul__", "__add__", "__mul__", "__eq__"),
    "namespace": ("__getattribute__", "__setattr__", "__delattr__", "__repr__"),
    "value": ("get", "set"),
}

#: every method the scheduler runs, by kind of object
ALLOWED: dict[str, frozenset[str]] = {kind: frozenset(FORWARDED[kind] + ALSO_ALLOWED[kind]) for kind in FORWARDED}

#: methods that change the object in place and return it: the caller gets None, not a copy
IN_PLACE = frozenset({"__iadd__", "__imul__"})
