"""Helpers shared by the test modules (fixtures live in conftest.py)."""

from __future__ import annotations

import re
import uuid

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def unique_topic(name: str) -> str:
    """A metrics topic name no other test uses (stores are per process and outlive a test)."""
    return f"{name}-{uuid.uuid4().hex[:6]}"


def cell_text(cell) -> str:
    """What a notebook cell shows as text: streams, tracebacks and plain-text results, without colours."""
    parts = []
    for o in cell.get("outputs", []):
        if o.get("output_type") == "stream":
            parts.append(o["text"])
        elif o.get("output_type") == "error":
            parts.append("\n".join(o["traceback"]))
        elif "text/plain" in o.get("data", {}):
            parts.append(o["data"]["text/plain"])
    return ANSI.sub("", "".join(parts))
