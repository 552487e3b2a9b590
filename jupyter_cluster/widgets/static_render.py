"""Static copies of the widgets' outputs, so saved and shared notebooks keep their results.

A widget output is only a reference (``application/vnd.jupyter.widget-view+json``)
to a model that lives in the kernel.  Once the kernel is gone, JupyterLab and
Notebook 7 draw "Error displaying widget: model not found" for it: the widget
renderer (rank -10) always wins and never falls back to the bundle's other
mimetypes.  nbconvert and nbviewer fall back only when the notebook holds no
widget state, and GitHub shows what else is in the bundle.  So every widget we
display carries a static part beside the reference (``text/plain`` and a
self-contained ``text/html``: charts as SVG images, the final progress line, the
cluster table), and:

* the static part is brought up to date at the end of every cell (a display-id
  update, :func:`refresh`), so a saved notebook holds each chart as of its
  last cell;
* a progress bar is replaced by its static final line when its job ends;
* the Jupyter server's pre-save hook (:func:`pre_save_hook`) drops the widget
  reference from our outputs when the notebook is saved without widget state,
  so a reopened notebook shows the static part.  The live views stay live in
  the open tab; a page reload shows the snapshot of the last save (the sidebar
  and a new ``jc.show_metrics(topic)`` are live again at once).

How to give a new widget a static part (e.g. a sweep table)
-----------------------------------------------------------
Subclass :class:`StaticOutput` first, then the ipywidgets/anywidget class, and
implement :meth:`StaticOutput.static_bundle` (``text/plain`` and ``text/html``;
plain strings, no scripts) and, if rendering costs, :meth:`StaticOutput.static_version`
(a value that changes when the picture would).  Displaying it (``display(w)``
or as the cell's value) then carries the static part and keeps it current.
Charts can use :func:`line_chart_svg`, :func:`heatmap_svg` and :func:`svg_img`.

Charts are drawn here in Python (a small SVG writer; heatmaps as PNG pixels
inside the SVG), so no plotting library is needed.  Imports nothing heavy.
"""

from __future__ import annotations

import base64
import html
import math
import re
import struct
import threading
import weakref
import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..telemetry.topic_store import lower_is_better

# an output's static part, defined a layer down (telemetry's progress bar uses it too); named here too
from ..wire.static_output import MARK as MARK
from ..wire.static_output import bundle as bundle
from ..wire.static_output import metadata as metadata

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"

#: the same 12 colours as the panel's charts (labextension/src/charts/colors.ts, light theme): the
#: most different 12 with 3:1 contrast on white, ordered so that every prefix is well separated
PALETTE = [
    "#3177ac", "#979500", "#a91315", "#de5dd4", "#045137", "#d47b10",
    "#584416", "#07a1a3", "#17a743", "#6f334c", "#c47f77", "#4a2ea7",
]  # fmt: skip
#: the panel's heatmap scale (labextension/src/charts/heatmaps.ts)
VIRIDIS = ["#440154", "#3b528b", "#21918c", "#5ec962", "#fde725"]

#: what one chart draws at most: lines, points per line, heatmap columns and rows
MAX_SERIES = 12
MAX_POINTS = 200
MAX_COLUMNS = 200
MAX_ROWS = 64
WIDTH = 560
FONT = "font-family:sans-serif;font-size:11px"


# -- numbers and colours ----------------------------------------------------------------
def fmt_num(v: float | None) -> str:
    """A number for a label: integers as integers, else four significant digits (as the panel)."""
    if v is None or not math.isfinite(v):
        return "-"
    if float(v).is_integer() and abs(v) < 1e6:
        return str(int(v))
    a = abs(v)
    if a != 0 and (a < 1e-3 or a >= 1e6):
        mant, exp = f"{v:.3e}".split("e")
        mant = mant.rstrip("0").rstrip(".")
        return f"{mant}e{int(exp)}"
    return f"{float(f'{v:.4g}'):g}"


#: a number in a key: an optional sign (after no letter, digit, ``_`` or ``.``), digits, decimals, exponent
_NUMBER_IN_KEY = re.compile(r"(?<![A-Za-z0-9_.])-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def natural_key(s: str) -> list[Any]:
    """Sort key for series keys, configs and names: numbers by value, text case-insensitively.

    Decimals and exponents are numbers too (``lr=0.001 < lr=0.003 < lr=0.01 < lr=1e-1``,
    ``trial=2 < trial=10``).  The same rule as ``labextension/src/charts/data.ts`` ``naturalCompare()``.
    """
    out: list[Any] = []
    last = 0
    for m in _NUMBER_IN_KEY.finditer(s):
        if m.start() > last:
            out.append((1, 0.0, s[last : m.start()].lower()))
        out.append((0, float(m.group()), ""))
        last = m.end()
    if last < len(s):
        out.append((1, 0.0, s[last:].lower()))
    return out


def _color_order(s: str) -> tuple[list[Any], str]:
    """Natural order, ties (``lr=0.1`` and ``lr=0.01``) by code point: the same whatever order the keys came in."""
    return natural_key(s), s


def _fnv1a(key: str) -> int:
    h = 0x811C9DC5
    units = key.encode("utf-16-le")  # JavaScript's charCodeAt: UTF-16 code units
    for i in range(0, len(units), 2):
        h ^= units[i] | (units[i + 1] << 8)
        h = (h * 0x01000193) & 0xFFFFFFFF
    return h


def assign_colors(keys: Iterable[str], more: Iterable[str] = ()) -> dict[str, str]:
    """One colour per series key, as the panel assigns them: in natural order, the palette's slots in turn.

    ``more`` are keys coloured after all of ``keys`` (the next slots), so
    ``keys`` get exactly the colours they get alone: the sweep table's rows
    without a series of their own.  The same rule as
    ``labextension/src/charts/colors.ts`` ``assignColors()`` (a shared fixture,
    ``labextension/src/__tests__/fixtures/colours.json``, checks both).
    """
    first = sorted(set(keys), key=_color_order)
    seen = set(first)
    after = sorted({k for k in more if k not in seen}, key=_color_order)
    return {key: PALETTE[i % len(PALETTE)] for i, key in enumerate(first + after)}


def shown_colors(shown: Iterable[str], colors: Mapping[str, str]) -> dict[str, str]:
    """The colours of the keys on screen: ``colors`` while no colour repeats more than the palette forces.

    Otherwise the shown keys are assigned among themselves (:func:`assign_colors`),
    so that a few rows never share a colour; ``colors.ts`` ``distinctColors()``
    is the same rule.
    """
    keys = list(dict.fromkeys(shown))
    most = -(-len(keys) // len(PALETTE))
    uses: dict[str, int] = {}
    for k in keys:
        uses[colors[k]] = uses.get(colors[k], 0) + 1
    if all(n <= most for n in uses.values()):
        return {k: colors[k] for k in keys}
    return assign_colors(keys)


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2, 2.5 or 5 times a power of ten) covering ``[lo, hi]``."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / max(1, count)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    ticks = []
    t = first
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 12))
        t += step
    return ticks


def _hex(c: str) -> tuple[int, int, int]:
    return int(c[1:3], 16), int(c[3:5], 16), int(c[5:7], 16)


_VIRIDIS_RGB = [_hex(c) for c in VIRIDIS]


def viridis(t: float) -> tuple[int, int, int]:
    """The colour of ``t`` in [0, 1] on the panel's heatmap scale (linear between its 5 stops)."""
    t = 0.0 if not math.isfinite(t) else min(1.0, max(0.0, t))
    x = t * (len(_VIRIDIS_RGB) - 1)
    i = min(int(x), len(_VIRIDIS_RGB) - 2)
    f = x - i
    a, b = _VIRIDIS_RGB[i], _VIRIDIS_RGB[i + 1]
    return (round(a[0] + (b[0] - a[0]) * f), round(a[1] + (b[1] - a[1]) * f), round(a[2] + (b[2] - a[2]) * f))


# -- PNG and SVG writing --------------------------------------------------------------------
def png_rgb(width: int, height: int, pixels: Sequence[Sequence[tuple[int, int, int]]]) -> bytes:
    """A truecolour PNG of ``height`` rows of ``width`` RGB pixels (top row first)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + bytes(v for px in row for v in px) for row in pixels)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def _e(s: Any) -> str:
    return html.escape(str(s), quote=True)


def _f(v: float) -> str:
    return f"{v:.1f}".rstrip("0").rstrip(".")


def svg_img(svg: str, alt: str) -> str:
    """An ``<img>`` holding ``svg`` as a data URI (passes JupyterLab's sanitizer, unlike inline SVG)."""
    data = base64.b64encode(svg.encode()).decode()
    return f'<img alt="{_e(alt)}" style="max-width:100%;display:block" src="data:image/svg+xml;base64,{data}">'


def _svg_head(width: int, height: int, ml: float, title: str, xlink: bool = False) -> list[str]:
    """A chart's opening SVG elements: the root (``xlink`` for an embedded image), a white ground, the bold title."""
    ns = ' xmlns:xlink="http://www.w3.org/1999/xlink"' if xlink else ""
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg"{ns} width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" style="{FONT}">',
        f'<rect width="{width}" height="{height}" fill="#fff"/>',
        f'<text x="{ml}" y="14" font-weight="bold">{_e(title)}</text>',
    ]


def _svg_note(out: list[str], ml: float, y: float, text: str) -> str:
    """The chart ``out`` ended with a grey note in place of its plot (nothing to draw)."""
    out.append(f'<text x="{ml}" y="{y}" fill="#777">{text}</text></svg>')
    return "".join(out)


def _bucket_points(points: Sequence[Sequence[float | None]], cap: int) -> list[tuple[float, float | None]]:
    """At most ~``cap`` points: min and max of each bucket (so peaks stay), gaps (None) kept."""
    pts: list[tuple[float, float | None]] = []
    for p in points:
        v = p[1]
        pts.append((float(p[0] or 0), float(v) if v is not None and math.isfinite(v) else None))
    if len(pts) <= cap:
        return pts
    size = math.ceil(len(pts) / (cap / 2))
    out: list[tuple[float, float | None]] = []
    for i in range(0, len(pts), size):
        chunk = pts[i : i + size]
        vals = [p for p in chunk if p[1] is not None]
        if len(vals) < len(chunk):
            out.append((chunk[0][0], None))  # keep the gap visible
        if not vals:
            continue
        lo = min(vals, key=lambda p: p[1])  # type: ignore[arg-type,return-value]
        hi = max(vals, key=lambda p: p[1])  # type: ignore[arg-type,return-value]
        out.extend(sorted({lo, hi}))
    return out


def _axes(x0: float, y0: float, w: float, h: float, xt: list[str], yt: list[str]) -> str:
    parts = [f'<rect x="{_f(x0)}" y="{_f(y0)}" width="{_f(w)}" height="{_f(h)}" fill="none" stroke="#bbb"/>']
    parts.extend(xt)
    parts.extend(yt)
    return "".join(parts)


def line_chart_svg(
    name: str,
    series: Mapping[str, Sequence[Sequence[float | None]]],
    width: int = WIDTH,
    colors: Mapping[str, str] | None = None,
) -> str:
    """An SVG line chart of one scalar value: a line per series over steps, a legend beneath.

    At most :data:`MAX_SERIES` lines (those with the highest last values; the
    chart says how many it left out) of at most ~:data:`MAX_POINTS` points each.
    ``colors`` gives each series its colour (default: :func:`assign_colors`
    over this chart's series; the live charts colour over the topic's keys).
    """
    keys = [k for k in series if any(p[1] is not None and math.isfinite(p[1]) for p in series[k])]
    left_out = 0
    # too many to draw: the best by their last value, lowest for a loss-like name (as the panel's "best")
    lower = lower_is_better(name)
    if len(keys) > MAX_SERIES:

        def last(k: str) -> float:
            vals = [p[1] for p in series[k] if p[1] is not None and math.isfinite(p[1])]
            return vals[-1] if vals else (math.inf if lower else -math.inf)

        keys = sorted(keys, key=last, reverse=not lower)[:MAX_SERIES]
        left_out = len(series) - len(keys)
    keys.sort(key=natural_key)
    colors = {**assign_colors(series), **(colors or {})}
    pts = {k: _bucket_points(series[k], MAX_POINTS) for k in keys}
    xs = [p[0] for k in keys for p in pts[k]]
    ys = [p[1] for k in keys for p in pts[k] if p[1] is not None]
    ml, mr, mt, mb = 58, 14, 22, 24
    ph = 150
    legend = [k for k in keys if k != "all"] if len(keys) > 1 or (keys and keys[0] != "all") else []
    per_row = 3
    legend_rows = math.ceil(len(legend) / per_row) + (1 if left_out else 0)
    height = mt + ph + mb + 16 * legend_rows + 4
    pw = width - ml - mr
    out = _svg_head(width, height, ml, name)
    if not xs or not ys:
        return _svg_note(out, ml, mt + ph / 2, "no finite values")
    xlo, xhi = min(xs), max(xs)
    ylo, yhi = min(ys), max(ys)
    if xhi == xlo:
        xlo, xhi = xlo - 1, xhi + 1
    if yhi == ylo:
        pad = abs(ylo) * 0.1 or 1.0
        ylo, yhi = ylo - pad, yhi + pad
    else:
        pad = (yhi - ylo) * 0.05
        ylo, yhi = ylo - pad, yhi + pad

    def sx(x: float) -> float:
        return ml + (x - xlo) / (xhi - xlo) * pw

    def sy(y: float) -> float:
        return mt + ph - (y - ylo) / (yhi - ylo) * ph

    xt = []
    for t in nice_ticks(xlo, xhi, 6):
        x = sx(t)
        xt.append(
            f'<line x1="{_f(x)}" x2="{_f(x)}" y1="{mt + ph}" y2="{mt + ph + 4}" stroke="#999"/>'
            f'<text x="{_f(x)}" y="{mt + ph + 15}" text-anchor="middle" fill="#444">{fmt_num(t)}</text>'
        )
    yt = []
    for t in nice_ticks(ylo, yhi, 4):
        y = sy(t)
        yt.append(
            f'<line x1="{ml}" x2="{ml + pw}" y1="{_f(y)}" y2="{_f(y)}" stroke="#eee"/>'
            f'<text x="{ml - 4}" y="{_f(y + 3.5)}" text-anchor="end" fill="#444">{fmt_num(t)}</text>'
        )
    out.append(_axes(ml, mt, pw, ph, xt, yt))
    for k in keys:
        d: list[str] = []
        pen = "M"
        for px, py in pts[k]:
            if py is None:
                pen = "M"
                continue
            d.append(f"{pen}{_f(sx(px))} {_f(sy(py))}")
            pen = "L"
        if len(d) == 1:  # a single point: a dot
            cx, cy = d[0][1:].split()
            out.append(f'<circle cx="{cx}" cy="{cy}" r="2.5" fill="{colors[k]}"/>')
        elif d:
            out.append(f'<path d="{"".join(d)}" fill="none" stroke="{colors[k]}" stroke-width="1.5"/>')
    ly = mt + ph + mb + 10
    col_w = pw / per_row
    for i, k in enumerate(legend):
        x = ml + (i % per_row) * col_w
        y = ly + (i // per_row) * 16
        label = k if len(k) <= 30 else k[:29] + "…"
        out.append(
            f'<rect x="{_f(x)}" y="{y - 8}" width="10" height="10" fill="{colors[k]}"/>'
            f'<text x="{_f(x + 14)}" y="{y + 1}" fill="#222">{_e(label)}</text>'
        )
    if left_out:
        y = ly + math.ceil(len(legend) / per_row) * 16
        out.append(
            f'<text x="{ml}" y="{y + 1}" fill="#777">{left_out} more series not drawn '
            f"(the {len(keys)} with the {'lowest' if lower else 'highest'} last value are)</text>"
        )
    out.append("</svg>")
    return "".join(out)


def _bucket_rows(steps: Sequence[float], rows: Sequence[Sequence[float | None]], cap: int):
    """At most ``cap`` columns: rows averaged in buckets of consecutive steps."""
    if len(rows) <= cap:
        return list(steps), [list(r) for r in rows]
    size = math.ceil(len(rows) / cap)
    out_steps, out_rows = [], []
    for i in range(0, len(rows), size):
        chunk = rows[i : i + size]
        width = max(len(r) for r in chunk)
        avg: list[float | None] = []
        for j in range(width):
            vals = [r[j] for r in chunk if j < len(r) and r[j] is not None and math.isfinite(r[j])]  # type: ignore[arg-type]
            avg.append(sum(vals) / len(vals) if vals else None)  # type: ignore[arg-type]
        out_steps.append(steps[i])
        out_rows.append(avg)
    return out_steps, out_rows


def vector_range(series: Mapping[str, Mapping[str, Any]]) -> tuple[float, float]:
    """The finite min and max over every row of every series of one vector value (one colour scale)."""
    vals = [
        v
        for vs in series.values()
        for row in vs.get("rows") or ()
        for v in row
        if v is not None and isinstance(v, (int, float)) and math.isfinite(v)
    ]
    return (min(vals), max(vals)) if vals else (0.0, 1.0)


def vector_axis_name(name: str) -> str:
    """The entries' axis of a vector value: ``X`` of ``..._per_X``, else ``name[i]`` (the panel's vectorAxisName)."""
    m = re.search(r"(?:^|_)per_([A-Za-z][A-Za-z0-9]*)$", name)
    return m.group(1) if m else f"{name}[i]"


def bar_title(name: str) -> str:
    """A colour bar's title: the value's name, cut to what fits beside the chart (the panel's barTitle)."""
    return f"{name[:10]}…" if len(name) > 11 else name


def heatmap_svg(
    name: str, key: str, vs: Mapping[str, Any], lo: float, hi: float, width: int = WIDTH, colour_bar: bool = True
) -> str:
    """An SVG heatmap of one vector series: steps across, the vector's entries up, ``lo``..``hi`` on one scale.

    The cells are a PNG (a block of pixels each), so a 200-step, 64-entry
    heatmap stays a few kilobytes.
    """
    steps, rows = _bucket_rows(list(vs.get("steps") or ()), list(vs.get("rows") or ()), MAX_COLUMNS)
    n = max((len(r) for r in rows), default=0)
    title = name if key == "all" else f"{name} · {key}"
    ml, mr, mt, mb = 58, 70 if colour_bar else 14, 22, 24
    ph = max(40, min(140, 12 * n))
    height = mt + ph + mb
    pw = width - ml - mr
    out = _svg_head(width, height, ml, title, xlink=True)
    if not rows or not n:
        return _svg_note(out, ml, mt + ph / 2, "no rows")
    span = (hi - lo) or 1.0
    grey = (221, 221, 221)
    # a block of pixels per (step, entry), entry 0 at the bottom: blocks of about the size they are
    # drawn at, so that a viewer's smoothing of an upscaled image cannot blur the cells together
    sx, sy = max(1, int(pw // len(rows))), max(1, int(ph // n))
    pixels = []
    for j in reversed(range(n)):
        line = []
        for r in rows:
            v = r[j] if j < len(r) else None
            px = grey if v is None or not math.isfinite(v) else viridis((v - lo) / span)
            line.extend([px] * sx)
        pixels.extend([line] * sy)
    png = base64.b64encode(png_rgb(len(rows) * sx, n * sy, pixels)).decode()
    out.append(
        f'<image x="{ml}" y="{mt}" width="{pw}" height="{ph}" preserveAspectRatio="none" '
        f'style="image-rendering:pixelated" xlink:href="data:image/png;base64,{png}"/>'
    )
    xlo, xhi = (steps[0], steps[-1]) if steps else (0, 1)
    if xhi == xlo:
        xhi = xlo + 1
    cw = pw / len(rows)
    xt = []
    for t in nice_ticks(xlo, xhi, 6):
        x = ml + (t - xlo) / (xhi - xlo) * (pw - cw) + cw / 2
        xt.append(
            f'<line x1="{_f(x)}" x2="{_f(x)}" y1="{mt + ph}" y2="{mt + ph + 4}" stroke="#999"/>'
            f'<text x="{_f(x)}" y="{mt + ph + 15}" text-anchor="middle" fill="#444">{fmt_num(t)}</text>'
        )
    yt = []
    rh = ph / n
    for t in nice_ticks(0, n - 1, min(4, n - 1) or 1):
        if t != int(t):
            continue
        y = mt + ph - (t + 0.5) * rh
        yt.append(f'<text x="{ml - 4}" y="{_f(y + 3.5)}" text-anchor="end" fill="#444">{int(t)}</text>')
    out.append(_axes(ml, mt, pw, ph, xt, yt))
    # the entries' axis named as the panel names it (tokens_per_expert: "expert"), never a bare "index"
    axis = vector_axis_name(name)
    yc = mt + ph / 2
    out.append(
        f'<text x="12" y="{_f(yc)}" transform="rotate(-90 12 {_f(yc)})" text-anchor="middle" fill="#444">'
        f"{_e(axis)}</text>"
    )
    if colour_bar:
        bx = ml + pw + 10
        gid = "g" + format(_fnv1a(title), "x")
        stops = "".join(
            f'<stop offset="{i / (len(VIRIDIS) - 1):.2f}" stop-color="{c}"/>' for i, c in enumerate(reversed(VIRIDIS))
        )
        out.append(
            f'<defs><linearGradient id="{gid}" x1="0" x2="0" y1="0" y2="1">{stops}</linearGradient></defs>'
            f'<rect x="{bx}" y="{mt}" width="10" height="{ph}" fill="url(#{gid})" stroke="#bbb"/>'
            # the bar's title: what its colours stand for (as the panel's colour bar)
            f'<text class="jc-bar-title" x="{bx}" y="{mt - 6}" fill="#444">{_e(bar_title(name))}</text>'
        )
        for t in nice_ticks(lo, hi, 3) or [lo]:
            y = mt + ph - (t - lo) / span * ph
            out.append(f'<text x="{bx + 14}" y="{_f(y + 3.5)}" fill="#444">{fmt_num(t)}</text>')
    out.append("</svg>")
    return "".join(out)


def metrics_html(model: Mapping[str, Any]) -> str:
    """Self-contained HTML of a topic's charts (a metrics data model): a line chart per scalar,
    a heatmap per vector series (one colour scale per vector value)."""
    topic = model.get("topic", "")
    head = f"<b>metrics {_e(topic)}</b>: {model.get('received', 0):,} reports"
    notes = []
    if model.get("dropped"):
        notes.append(f"{model['dropped']:,} dropped")
    if model.get("truncated"):
        notes.append(f"{model['truncated']:,} points truncated")
    if notes:
        head += " (" + ", ".join(notes) + ")"
    parts = [f"<div class='jupyter-cluster-static jupyter-cluster-metrics'><div>{head}</div>"]
    scalars = model.get("scalars") or {}
    vectors = model.get("vectors") or {}
    # one colour per series key over the whole topic, as the live charts (charts.ts allSeriesKeys)
    colors = assign_colors(k for by in (*scalars.values(), *vectors.values()) for k in by)
    for name in sorted(scalars, key=natural_key):
        parts.append(svg_img(line_chart_svg(name, scalars[name], colors=colors), f"{topic}: {name}"))
    for name in sorted(vectors, key=natural_key):
        lo, hi = vector_range(vectors[name])
        for key in sorted(vectors[name], key=natural_key):
            parts.append(svg_img(heatmap_svg(name, key, vectors[name][key], lo, hi), f"{topic}: {name} {key}"))
    if not scalars and not vectors:
        parts.append("<div><i>No metrics yet.</i></div>")
    parts.append("</div>")
    return "".join(parts)


# -- displaying widgets with their static part -----------------------------------------------
class StaticOutput:
    """Mixin for a widget whose outputs carry a static copy, kept current at each cell's end.

    Subclasses implement :meth:`static_bundle` and may implement
    :meth:`static_version`.  List it before the widget class.
    """

    _static_sent: Any = None

    def static_bundle(self) -> dict[str, str]:
        """``{"text/plain": ..., "text/html": ...}``: what a reader without the kernel sees."""
        raise NotImplementedError

    def static_version(self) -> Any:
        """A value that changes when :meth:`static_bundle` would; None: render at every cell end."""
        return None

    @property
    def display_id(self) -> str:
        return f"jupyter-cluster-{self.model_id}"  # type: ignore[attr-defined]

    def _ipython_display_(self, **kwargs: Any) -> None:
        show(self)


_displayed: weakref.WeakSet[Any] = weakref.WeakSet()
_hook_lock = threading.Lock()
_hooked: set[int] = set()


def show(widget: StaticOutput) -> None:
    """Display ``widget`` with its static part under its display id; :func:`refresh` updates it."""
    from IPython.display import display

    version = widget.static_version()
    data = bundle(widget, widget.static_bundle())
    widget._static_sent = version
    display(data, raw=True, metadata=metadata(), display_id=widget.display_id)
    _displayed.add(widget)
    _install_hook()


def refresh() -> int:
    """Bring the static part of every open displayed widget up to date; returns how many changed."""
    from IPython.display import update_display

    changed = 0
    for widget in list(_displayed):
        if getattr(widget, "comm", None) is None:  # closed: its outputs keep their last static part
            _displayed.discard(widget)
            continue
        try:
            version = widget.static_version()
            if version is not None and version == widget._static_sent:
                continue
            data = bundle(widget, widget.static_bundle())
            widget._static_sent = version
            update_display(data, raw=True, metadata=metadata(), display_id=widget.display_id)
            changed += 1
        except Exception:  # a static copy must never fail a cell
            import logging

            logging.getLogger(__name__).debug("static output update failed", exc_info=True)
    return changed


def _after_cell(result: Any = None) -> None:
    refresh()


def _install_hook() -> None:
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None:
        return
    with _hook_lock:
        if id(shell) in _hooked:
            return
        _hooked.add(id(shell))
    shell.events.register("post_run_cell", _after_cell)


# -- saving ----------------------------------------------------------------------------------
def _saved_models(nb: Mapping[str, Any]) -> set[str]:
    state = ((nb.get("metadata") or {}).get("widgets") or {}).get(WIDGET_STATE) or {}
    return set((state.get("state") or {}).keys())


def strip_widget_views(nb: dict[str, Any]) -> int:
    """Drop the widget reference from our outputs that have a static part and no saved widget state.

    ``nb`` is a notebook as JSON (changed in place).  Returns how many
    outputs changed.  Outputs of other widgets, and ours whose model state
    the notebook holds (JupyterLab's "save widget state"), are left as they are.
    """
    saved = _saved_models(nb)
    changed = 0
    for cell in nb.get("cells") or ():
        for out in cell.get("outputs") or ():
            data = out.get("data")
            if not isinstance(data, dict) or WIDGET_VIEW not in data:
                continue
            if MARK not in (out.get("metadata") or {}):
                continue
            view = data[WIDGET_VIEW]
            if isinstance(view, dict) and view.get("model_id") in saved:
                continue
            if len(data) < 2:  # nothing static beside the reference
                continue
            del data[WIDGET_VIEW]
            changed += 1
    return changed


def pre_save_hook(model: dict[str, Any], **kwargs: Any) -> None:
    """Jupyter server pre-save hook: a saved notebook keeps our widgets' static parts only.

    Registered by the server extension; see :func:`strip_widget_views`.
    """
    if model.get("type") != "notebook" or not isinstance(model.get("content"), dict):
        return
    try:
        strip_widget_views(model["content"])
    except Exception:  # never fail a save
        import logging

        logging.getLogger(__name__).debug("stripping widget views on save failed", exc_info=True)
