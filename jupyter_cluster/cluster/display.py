"""Static renderings of a cluster model: an HTML table and a few lines of text.

What a cluster shows where there is no widget (a terminal, a front end without
ipywidgets, a saved notebook's HTML).  Imports no ipywidgets.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any


def fmt_bytes(n: float | None) -> str:
    """``n`` bytes for people (``"1.50 GiB"``), or ``"-"`` for none."""
    from dask.utils import format_bytes

    return format_bytes(int(n)) if n else "-"


def render_html(m: Mapping[str, Any]) -> str:
    """A static HTML table of a cluster model (used where widgets are unavailable)."""
    url = m.get("dashboard_link")
    link = f'<a href="{html.escape(url)}" target="_blank">{html.escape(url)}</a>' if url else "-"
    rows = "".join(
        f"<tr><td>{html.escape(w['name'])}</td><td>{html.escape(w['status'])}</td><td>{w['nthreads']}</td>"
        f"<td>{fmt_bytes(w['memory'])} / {fmt_bytes(w['memory_limit'])}</td><td>{w['cpu']:.0f} %</td>"
        f"<td>{w['executing']}</td></tr>"
        for w in m["workers"]
    )
    return (
        f"<div class='jupyter-cluster'><b>{html.escape(m['name'])}</b> ({html.escape(m['backend'])}) "
        f"<code>{html.escape(m['address'])}</code><br>Dashboard: {link}<br>"
        f"{m['n_workers']} workers, {m['cores']} cores, {fmt_bytes(m['memory_limit'])} memory"
        "<table><tr><th>worker</th><th>status</th><th>threads</th><th>memory</th><th>CPU</th><th>tasks</th></tr>"
        f"{rows}</table></div>"
    )


def text_status(m: Mapping[str, Any]) -> str:
    """A few lines of plain text describing a cluster model."""
    lines = [
        f"{m['name']} ({m['backend']}) at {m['address']}",
        f"dashboard: {m.get('dashboard_link') or '-'}",
        f"{m['n_workers']} workers, {m['cores']} cores, memory {fmt_bytes(m['memory'])} / {fmt_bytes(m['memory_limit'])}",
    ]
    for w in m["workers"]:
        lines.append(
            f"  {w['name']:>10}  {w['status']:<8} threads={w['nthreads']} mem={fmt_bytes(w['memory'])}/{fmt_bytes(w['memory_limit'])} cpu={w['cpu']:.0f}% tasks={w['executing']}"
        )
    return "\n".join(lines)
