"""The options a backend declares: what ``%cluster start`` parses, shows in ``--help`` and passes on.

A backend lists its :class:`Option` rows in ``Backend.cli_options`` (as
ipyparallel's launchers declare their traits); the magic builds its parser from
the rows of every registered backend (:func:`merged`), so a new backend, built in
or from another package, needs no change to the magic.  An option several
backends take (``--workers``) is one flag; its help says which backends take it.
The rows several built-in backends share are defined here once.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

#: how a flag is written on the command line
Kind = Literal["value", "flag", "switch", "list", "optional"]


@dataclass(frozen=True)
class Option:
    """One option of a backend's ``start``, as the command line writes it.

    Attributes
    ----------
    name : str
        The keyword ``Backend.start`` takes (``memory_limit``); the flag is
        ``--memory-limit``.
    help : str
        What it does, in a few words (shown by ``%cluster start --help``).
    type : callable, optional
        Converts the command line's text (``int``); None keeps the text.
    metavar : str, optional
        The value's name in the help (``W``).
    kind : str
        ``"value"`` (``--workers 4``), ``"flag"`` (``--dry-run``: True when
        given), ``"switch"`` (``--tls`` / ``--no-tls``), ``"list"`` (``--env A=1
        B=2``: one or more values, the flag repeatable) or ``"optional"``
        (``--gpus`` alone is True, ``--gpus 0,1`` a value).
    """

    name: str
    help: str
    type: Callable[[str], Any] | None = None
    metavar: str | None = None
    kind: Kind = "value"

    @property
    def flag(self) -> str:
        """The command-line flag, ``--memory-limit`` for ``memory_limit``."""
        return "--" + self.name.replace("_", "-")

    def argparse_arguments(self, help: str) -> list[tuple[tuple[str, ...], dict[str, Any]]]:
        """``(flags, keywords)`` of the ``add_argument`` calls that parse this option (a switch has two)."""
        if self.kind == "flag":
            return [((self.flag,), {"dest": self.name, "action": "store_true", "default": None, "help": help})]
        if self.kind == "switch":
            negative = "--no-" + self.flag[2:]
            return [
                ((self.flag,), {"dest": self.name, "action": "store_true", "default": None, "help": help}),
                ((negative,), {"dest": self.name, "action": "store_false", "help": argparse.SUPPRESS}),
            ]
        kwargs: dict[str, Any] = {"dest": self.name, "metavar": self.metavar or self.name.upper(), "help": help}
        if self.type is not None:
            kwargs["type"] = self.type
        if self.kind == "list":
            kwargs.update(nargs="+", action="extend")
        elif self.kind == "optional":
            kwargs.update(nargs="?", const=True, default=None)
        return [((self.flag,), kwargs)]

    def parses_like(self, other: Option) -> bool:
        """Whether ``other`` is read from the command line the same way (so both can share one flag)."""
        return (self.name, self.type, self.kind) == (other.name, other.type, other.kind)


@dataclass(frozen=True)
class MergedOption:
    """One ``%cluster start`` flag: the option as the first backend declares it, and every backend that takes it."""

    option: Option
    backends: tuple[str, ...]
    helps: tuple[tuple[str, str], ...]  # (backend, its help) for each backend

    def help(self) -> str:
        """The help shown: each text once, with the backends it is theirs for."""
        by_text: dict[str, list[str]] = {}
        for backend, text in self.helps:
            by_text.setdefault(text, []).append(backend)
        return "; ".join(f"{text} [{', '.join(names)}]" for text, names in by_text.items())


def merged(backends: Iterable[tuple[str, Iterable[Option]]]) -> list[MergedOption]:
    """Every backend's options as one list of flags, in order of first appearance.

    An option a later backend declares with other parsing (another type or
    kind) than the first keeps the first's parsing; the backend then gets the
    first's value and judges it itself.
    """
    order: list[str] = []
    found: dict[str, tuple[Option, list[str], list[tuple[str, str]]]] = {}
    for backend, options in backends:
        for option in options:
            if option.name not in found:
                order.append(option.name)
                found[option.name] = (option, [], [])
            _, names, helps = found[option.name]
            names.append(backend)
            helps.append((backend, option.help))
    return [MergedOption(found[n][0], tuple(found[n][1]), tuple(found[n][2])) for n in order]


# -- rows several built-in backends share -----------------------------------------------------
WORKERS = Option("workers", "number of workers to start", int, "W")
THREADS = Option("threads", "threads per worker", int, "T")
MEMORY_LIMIT = Option("memory_limit", 'memory per worker, like "4GiB"', None, "M")
PORT = Option("port", "the scheduler's TCP port (0 or none: a free one)", int, "P")
HOST = Option("host", "the address the scheduler binds to", None, "H")
TLS = Option("tls", "TLS between scheduler, workers and client (--no-tls: plain TCP)", kind="switch")
ADAPT_MIN = Option("adapt_min", "adaptive: the fewest workers", int, "A")
ADAPT_MAX = Option("adapt_max", "adaptive: the most workers", int, "B")
