"""What the magics share to parse their lines: an argparse that raises ``UsageError``, and option tables."""

from __future__ import annotations

import argparse
from typing import Any

from IPython.core.error import UsageError


class MagicArgumentParser(argparse.ArgumentParser):
    """argparse that raises a ``UsageError`` (with the magic's usage) instead of exiting the kernel.

    Subclasses set :attr:`magic` (e.g. ``"%cluster"``) and :attr:`usage_text`.
    """

    magic = ""
    usage_text = ""

    def error(self, message: str):
        raise UsageError(f"{self.magic}: {message}.\n\n{self.usage_text}")

    def exit(self, status: int = 0, message: str | None = None):
        raise UsageError(message or self.usage_text)


def add_options(parser: argparse.ArgumentParser, options: list[tuple[str, dict[str, Any], str]]) -> None:
    """Add ``(flag, add_argument keywords, help)`` options, the table a cell magic's usage is written from."""
    for flag, kwargs, text in options:
        parser.add_argument(flag, help=text, **kwargs)


def options_text(options: list[tuple[str, dict[str, Any], str]]) -> str:
    """The options table as usage lines: flag and metavar, then what it does."""
    lines = []
    for flag, kwargs, text in options:
        left = f"  {flag} {kwargs['metavar']}" if "metavar" in kwargs else f"  {flag}"
        lines.append(f"{left:<24}{text}" if len(left) < 24 else f"{left}  {text}")
    return "\n".join(lines) + "\n"
