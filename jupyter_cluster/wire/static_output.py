"""An output's static part: what a reader without the kernel sees beside a widget.

Every widget output of ours (a cluster, a chart, a map's progress bar) carries
``text/plain`` and ``text/html`` beside the widget reference, marked with
:data:`MARK` in its metadata; :mod:`jupyter_cluster.widgets.static_render` keeps
those parts current and strips the references on save.  These few pieces live
here, below the telemetry layer, because the progress bar
(:mod:`jupyter_cluster.tracking.progress`) uses them too.  Imports no ipywidgets.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

#: output metadata key that marks our outputs (the pre-save hook touches only those)
MARK = "jupyter_cluster"


def progress_html(line: str, state: str, fraction: float | None, failed: float = 0.0) -> str:
    """The final progress line as HTML: a small bar in the state's colour and the text.

    ``failed`` is the part of the bar (0 to ``fraction``) that failed items take: drawn red
    after the good ones, as the panel draws it, so a map that collected errors is not all green.
    """
    colour = {"finished": "#5cb85c", "failed": "#d9534f", "cancelled": "#f0ad4e"}.get(state, "#337ab7")
    bar = ""
    if fraction is not None:
        pct = max(0.0, min(1.0, fraction)) * 100
        bad = max(0.0, min(pct, failed * 100))
        seg = "display:inline-block;height:100%;vertical-align:top"
        bar = (
            "<span style='display:inline-block;width:160px;height:0.9em;background:#e6e6e6;"
            "vertical-align:middle;margin-right:8px;border-radius:2px;overflow:hidden;white-space:nowrap'>"
            f"<span style='{seg};width:{pct - bad:.0f}%;background:{colour}'></span>"
            + (f"<span class='jc-failed' style='{seg};width:{bad:.0f}%;background:#d9534f'></span>" if bad else "")
            + "</span>"
        )
    return f"<div class='jupyter-cluster-static jupyter-cluster-progress'>{bar}<code>{html.escape(line, quote=True)}</code></div>"


def bundle(widget: Any, static: Mapping[str, str]) -> dict[str, Any]:
    """The widget's own mimebundle (the view reference) with ``static`` beside it."""
    data = widget._repr_mimebundle_()
    if isinstance(data, tuple):
        data = data[0]
    data = dict(data or {})
    data.update(static)
    return data


def metadata() -> dict[str, Any]:
    """The metadata of our outputs that carry a static part."""
    return {MARK: {"static": True}}


def replace(display_id: str, static: Mapping[str, str]) -> None:
    """Replace every output under ``display_id`` with ``static`` alone (the widget's work is over)."""
    from IPython.display import update_display

    update_display(dict(static), raw=True, metadata=metadata(), display_id=display_id)
