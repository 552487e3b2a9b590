"""The sweep table in the notebook: one row per sweep item or run, its config and metrics, and its curves.

:func:`show_runs` draws what :func:`jupyter_cluster.runs` returns as a DataFrame,
live: a sortable, filterable table; ticked rows overlaid on one chart; curves
grouped by a config key as mean ± sd bands; a parallel-coordinates view of
config -> metric.  The drawing is the ES module ``static/sweep.js``, bundled
from ``labextension/src/sweep`` (the same code as the sidebar's main-area
view).  This side only sends the ``data`` trait: the rows of
:func:`jupyter_cluster.tracking.runs.table` and, per metric, each row's curve.

A row's curve is its item's own (each topic keeps every sweep item's curves,
:func:`jupyter_cluster.tracking.runs.merge_curves`), else the topic's series that
belongs to it: the series whose key is the item's key (``"lr=0.1, aux=True"``),
or whose identity fields (e.g. ``report(step, trial=3, loss=...)``) all equal
the row's config values.

A row's colour (its swatch, its curve, its line in the parallel coordinates,
and the static copy's) is the colour its series has in the topic's metric
charts, the notebook's and the sidebar's: :func:`row_series` finds each row's
series key and the key set those charts colour over, and
:func:`jupyter_cluster.widgets.static_render.assign_colors` is their rule.
"""

from __future__ import annotations

import math
import pathlib
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .._core import context, ticker
from ..state.history_files import series_keys
from ..telemetry.topic_store import lower_is_better
from .anywidgets import built_once
from .run_pin import RunPin
from .static_render import natural_key

STATIC = pathlib.Path(__file__).parent / "static"
BUNDLE = STATIC / "sweep.js"
#: seconds between checks for new runs or reports while the widget is shown
REFRESH = 1.0
#: points per curve sent to the browser (evenly thinned beyond)
MAX_POINTS = 2000

MISSING_BUNDLE = (
    "The sweep table needs the widget bundle jupyter_cluster/widgets/static/sweep.js, which is not built; "
    "build it with `jlpm build:widget` in the source tree, or reinstall jupyter-cluster."
)


def _row_id(row: Mapping[str, Any]) -> str:
    key = row.get("key")
    item = row.get("item")
    suffix = key if key else ("" if item is None else str(item))
    return f"{row.get('run')}:{suffix}"


def _text(v: Any) -> str:
    if isinstance(v, bool):
        return "True" if v else "False"
    if isinstance(v, float) and v.is_integer():
        return str(v)
    return str(v)


def _series_fields(key: str) -> dict[str, str] | None:
    """``"trial=3, member=1"`` -> ``{"trial": "3", "member": "1"}``; None for ``all`` or a key that is not fields."""
    if key == "all":
        return None
    out: dict[str, str] = {}
    for part in key.split(", "):
        name, eq, value = part.partition("=")
        if not eq or not name:
            return None
        out[name] = value
    return out


def series_of(row: Mapping[str, Any], keys: Iterable[str]) -> str | None:
    """The series key (of ``keys``) that holds ``row``'s curve, or None.

    Its key is the row's item key, or its identity fields all equal config values of the row.
    """
    keys = sorted(keys, key=lambda k: (natural_key(k), k))
    if row.get("key") and row["key"] in keys:
        return str(row["key"])
    config = row.get("config") or {}
    for k in keys:
        fields = _series_fields(k)
        if fields and all(name in config and _text(config[name]) == value for name, value in fields.items()):
            return k
    return None


def topic_series(model: Mapping[str, Any]) -> list[str]:
    """Every series key of a topic's model (scalar and vector values alike), as its charts list them."""
    keys = series_keys(model.get("scalars") or {}, model.get("vectors") or {})
    return sorted(keys, key=natural_key)


def row_series(
    rows: Sequence[Mapping[str, Any]], topics: Mapping[str, Iterable[str]]
) -> tuple[list[str | None], list[str]]:
    """Each row's series key in the metric charts (or None), and the key set those charts colour over.

    In the topics (natural order of name), a row's series is the one
    :func:`series_of` finds among the topic's series keys; the key set is
    every key of the topics some row's series is in.  The same rule as
    ``labextension/src/sweep/model.ts`` ``rowSeries()``.
    """
    found: list[str | None] = [None] * len(rows)
    color_keys: set[str] = set()
    for topic in sorted(topics, key=natural_key):
        keys = list(topics[topic])
        hit = False
        for i, r in enumerate(rows):
            if found[i] is None:
                found[i] = series_of(r, keys)
                hit = hit or found[i] is not None
        if hit:
            color_keys.update(keys)
    return found, sorted(color_keys, key=natural_key)


def row_colors(data: Mapping[str, Any]) -> dict[str, str]:
    """Each row's colour (light theme) by row id: its series' colour in the metric charts, as the widget draws it."""
    from .static_render import assign_colors, shown_colors

    rows = list(data.get("rows") or [])
    own = [r.get("series") or r["id"] for r in rows]
    colors = shown_colors(own, assign_colors(data.get("colorKeys") or [], more=own))
    return {r["id"]: colors[k] for r, k in zip(rows, own, strict=True)}


def _thin(points: list[list[Any]]) -> list[list[Any]]:
    if len(points) <= MAX_POINTS:
        return points
    step = len(points) / MAX_POINTS
    return [points[int(i * step)] for i in range(MAX_POINTS - 1)] + [points[-1]]


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def sweep_data(
    rows: list[dict[str, Any]],
    models: Iterable[Mapping[str, Any]],
    title: str = "",
    item_curves: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None,
    topics: Mapping[str, Iterable[str]] | None = None,
) -> dict[str, Any]:
    """What the widget draws: ``{"title", "rows", "curves", "colorKeys"}`` (see ``labextension/src/sweep/model.ts``).

    Parameters
    ----------
    rows : list of dict
        Rows of :func:`jupyter_cluster.tracking.runs.table`: ``run``, ``key``, ``item``,
        ``name``, ``state``, ``duration``, ``config``, ``final``, ``best``.
    models : iterable of dict
        Metrics models (:meth:`TopicStore.model`) the curves of rows without their own are taken from.
    item_curves : dict, optional
        ``run -> metric -> item key -> points`` (:func:`jupyter_cluster.tracking.runs.merge_curves` per run).
    topics : dict, optional
        ``topic -> its series keys``, by which each row gets its series' colour
        (:func:`row_series`); default: those of ``models``.
    """
    models = list(models)
    if topics is None:
        topics = {str(m.get("topic", i)): topic_series(m) for i, m in enumerate(models)}
    series, color_keys = row_series(rows, topics)
    out_rows: list[dict[str, Any]] = []
    for r, own in zip(rows, series, strict=True):
        name = r.get("key") or r.get("name") or str(r.get("run"))
        out_rows.append(
            {
                "id": _row_id(r),
                "name": str(name),
                "series": own,
                "state": r.get("state"),
                "duration": _number(r.get("duration")),
                "config": {
                    k: (v if v is None or isinstance(v, (bool, int, float, str)) else str(v))
                    for k, v in (r.get("config") or {}).items()
                },
                "final": {k: _number(v) for k, v in (r.get("final") or {}).items()},
                "best": {k: _number(v) for k, v in (r.get("best") or {}).items()},
            }
        )
    curves: dict[str, dict[str, list[list[Any]]]] = {}
    for r, out in zip(rows, out_rows, strict=True):
        if not r.get("key") and r.get("item") is not None:
            continue  # an item whose key is not known (a DataFrame row): matched by its series below
        for metric, by_key in ((item_curves or {}).get(str(r.get("run"))) or {}).items():
            points = by_key.get(r.get("key") or "")
            if points:
                curves.setdefault(metric, {})[out["id"]] = _thin(list(points))
    for model in models:
        for metric, by_series in (model.get("scalars") or {}).items():
            for r, out in zip(rows, out_rows, strict=True):
                if out["id"] in curves.get(metric, {}):
                    continue
                key = series_of(r, by_series)
                if key is not None:
                    curves.setdefault(metric, {})[out["id"]] = _thin(by_series[key])
    return {"title": title, "rows": out_rows, "curves": curves, "colorKeys": color_keys}


def _select(records: Iterable[Mapping[str, Any]], notebook: str | None, run: str | None) -> list[Mapping[str, Any]]:
    return [
        r
        for r in records
        if (notebook is None or r.get("notebook") == notebook) and (run is None or r.get("run") == run)
    ]


def current_rows(notebook: str | None = None, run: str | None = None, pin: Any = None) -> list[dict[str, Any]]:
    """This kernel's sweep table rows (as :func:`jupyter_cluster.runs` has them), newest run last.

    ``pin`` (a :class:`.run_pin.RunPin`) keeps them to the run a live table was made for.
    """
    from ..telemetry.topic_store import all_stores
    from ..tracking.record import kept_jobs
    from ..tracking.table import group_runs, merge_metrics, table

    records = list(group_runs(kept_jobs()).values())
    if pin is not None:
        run = pin.resolve(records)
        if run is None:  # made before any run: empty until the first one starts
            return []
    chosen = _select(records, notebook, run)
    return table(chosen, merge_metrics(all_stores(), [r["run"] for r in chosen]))


def _stores(topic: str | None) -> list[Any]:
    from ..telemetry.topic_store import all_stores

    return [s for s in all_stores() if topic is None or s.topic == topic]


def _store_series(store: Any) -> list[str]:
    """A topic store's series keys, as its model (and so its charts) has them, without building the model."""
    return sorted(series_keys(store.scalars, store.vectors), key=natural_key)  # (safe while the store grows)


def _curves(
    rows: list[dict[str, Any]], topic: str | None
) -> tuple[dict[str, Any], list[Mapping[str, Any]], dict[str, list[str]]]:
    """The rows' own curves per run, the topics' models when some row has none (matched by series),
    and each topic's series keys (the rows' colours)."""
    from ..tracking.table import merge_curves

    stores = _stores(topic)
    own = {run: merge_curves(stores, run) for run in {str(r.get("run")) for r in rows}}
    covered = all(
        any((r.get("key") or "") in by_key for by_key in own.get(str(r.get("run")), {}).values()) for r in rows
    )
    topics = {str(s.topic): _store_series(s) for s in stores}
    return own, ([] if covered else [s.model() for s in stores]), topics


def _version(topic: str | None) -> tuple:
    from ..telemetry.topic_store import all_stores
    from ..tracking.record import kept_jobs

    jobs = kept_jobs()
    stores = [(s.topic, s.version) for s in all_stores() if topic is None or s.topic == topic]
    return (len(jobs), repr(jobs[-1]) if jobs else "", tuple(stores))


#: rows a static copy lists
STATIC_ROWS = 100


def _legend_labels(rows: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Row id -> its name in a chart's legend; rows that share a name (one item key in two runs) are numbered."""
    out: dict[str, str] = {}
    taken: set[str] = set()
    for r in rows:
        label, i = str(r["name"]), 1
        while label in taken:
            i += 1
            label = f"{r['name']} ({i})"
        taken.add(label)
        out[r["id"]] = label
    return out


def best_rows(rows: Sequence[Mapping[str, Any]], metrics: Iterable[str]) -> dict[str, str]:
    """Metric -> the id of the row with the best final value (lowest for a loss-like name, else highest).

    The same choice as the panel's ``bestRowIds()`` (``labextension/src/sweep/direction.ts``):
    the first row in table order wins a tie; a metric no row has a number for is left out.
    """
    out: dict[str, str] = {}
    for m in metrics:
        lower = lower_is_better(m)
        found: tuple[float, str] | None = None
        for r in rows:
            v = _number((r.get("final") or {}).get(m))
            if v is not None and (found is None or (v < found[0] if lower else v > found[0])):
                found = (v, r["id"])
        if found is not None:
            out[m] = found[1]
    return out


def static_bundle(data: Mapping[str, Any]) -> dict[str, str]:
    """The sweep's static copy: ``text/plain`` and ``text/html`` (the first metric's curves and the table)."""
    import html

    from .static_render import fmt_num, line_chart_svg, svg_img

    rows = list(data.get("rows") or [])
    config_keys = list(dict.fromkeys(k for r in rows for k in r["config"]))
    metrics = list(dict.fromkeys(m for r in rows for m in r["final"]))
    header = ["run", "state", *config_keys, *metrics]

    best = best_rows(rows, metrics)

    def cells(r: Mapping[str, Any]) -> list[str]:
        conf = [fmt_num(v) if isinstance(v, float) else str(v) for v in (r["config"].get(k, "") for k in config_keys)]
        finals = [fmt_num(r["final"].get(m)) + (" ★" if best.get(m) == r["id"] else "") for m in metrics]
        return [str(r["name"]), str(r.get("state") or ""), *conf, *finals]

    body = [cells(r) for r in rows[:STATIC_ROWS]]
    more = f"… {len(rows) - STATIC_ROWS} more rows" if len(rows) > STATIC_ROWS else ""
    title = f"{data.get('title') or 'runs'}: {len(rows)} rows"
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(header)]
    text = [title, "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    text += ["  ".join(c.ljust(w) for c, w in zip(b, widths, strict=True)) for b in body]
    parts = [f"<p><b>{html.escape(title)}</b></p>"]
    colors = row_colors(data)  # each row's colour in the live widget and the metric charts
    # the chart draws what the live widget draws first: a loss before an accuracy (what a sweep minimises)
    metric = next((m for m in metrics if lower_is_better(m)), metrics[0] if metrics else "")
    curves = (data.get("curves") or {}).get(metric) if metrics else None
    if curves:
        labels = _legend_labels(rows)  # the chart's series are by label: rows that share a name stay apart
        svg = line_chart_svg(
            metric,
            {labels.get(k, k): v for k, v in curves.items()},
            colors={labels[k]: colors[k] for k in curves if k in labels},
        )
        parts.append(svg_img(svg, f"{metric} of each run"))
    th = "<th></th>" + "".join(f"<th>{html.escape(h)}</th>" for h in header)
    trs = "".join(
        f'<tr><td><span class="jc-swatch" style="color:{colors[r["id"]]}">&#9632;</span></td>'
        + "".join(f"<td>{html.escape(c)}</td>" for c in b)
        + "</tr>"
        for r, b in zip(rows, body, strict=False)
    )
    parts.append(f"<table><thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table>")
    if best:
        note = "★ the best final value of each metric (lowest for a loss-like name, else highest)"
        text.append(note)
        parts.append(f"<p>{html.escape(note)}</p>")
    if more:
        text.append(more)
        parts.append(f"<p>{html.escape(more)}</p>")
    return {"text/plain": "\n".join(text), "text/html": "".join(parts)}


_widget_class: Any = None


def widget_class():
    """The anywidget class of the sweep table (built on first use; needs the JS bundle)."""
    global _widget_class
    _widget_class = built_once(_widget_class, BUNDLE, MISSING_BUNDLE, _build_widget_class)
    return _widget_class


def _build_widget_class() -> type:
    import anywidget
    import traitlets as t

    from .static_render import StaticOutput

    class SweepWidget(StaticOutput, anywidget.AnyWidget):
        """The sweep table: rows of config and metrics, curves overlaid or grouped, parallel coordinates.

        Its outputs also carry a static copy (the table and the first metric's curves), so a saved
        notebook shows them without the kernel.
        """

        _esm = BUNDLE
        data = t.Dict().tag(sync=True)
        chart_height = t.Int(280).tag(sync=True)
        #: the browser's sort, filter, grouping and ticked rows (kept so a re-rendered output keeps them)
        view_state = t.Dict().tag(sync=True)

        def __init__(
            self, rows: list | None, where: dict[str, Any], topic: str | None, title: str, **kwargs: Any
        ) -> None:
            super().__init__(data={"title": title, "rows": [], "curves": {}}, **kwargs)
            self._rows = rows
            self._where = where
            self._topic = topic
            self._title = title
            self._seen: tuple | None = None
            self._refreshed = 0
            self._lock = threading.Lock()
            self.refresh()
            if rows is None:  # following this kernel's runs: new runs and reports appear
                ticker.every(REFRESH, self._tick)

        def refresh(self) -> None:
            """Rebuild the table from the runs and curves now."""
            with self._lock:
                rows = current_rows(**self._where) if self._rows is None else self._rows
                own, models, topics = _curves(rows, self._topic)
                self.data = sweep_data(rows, models, self._title, own, topics)
                self._refreshed += 1

        def static_version(self) -> Any:
            return self._refreshed

        def static_bundle(self) -> dict[str, str]:
            return static_bundle(self.data)

        def _tick(self) -> bool:
            if self.comm is None:
                return False  # closed: stop
            seen = _version(self._topic)
            if seen != self._seen:
                self._seen = seen
                self.refresh()
            return True

        def __repr__(self) -> str:
            rows = self.data.get("rows") or []
            return f"<sweep table: {len(rows)} rows>"

    return SweepWidget


def _rows_from(runs: Any) -> list[dict[str, Any]]:
    """Rows given by the caller: :func:`jupyter_cluster.tracking.runs.table` rows, or a DataFrame of :func:`jupyter_cluster.runs`."""
    if isinstance(runs, list):
        if not all(isinstance(r, Mapping) and "run" in r for r in runs):
            raise TypeError(
                "show_runs(runs=...): a list must hold the row dicts of jupyter_cluster.tracking.runs.table()."
            )
        return [dict(r) for r in runs]
    columns = getattr(runs, "columns", None)
    if columns is None or "run" not in columns:
        raise TypeError(
            f"show_runs(runs=...) takes the DataFrame of jc.runs() (or its rows), not {type(runs).__name__}."
        )
    fixed = {"run", "name", "notebook", "cell", "item", "state", "duration"}
    metrics = [c[: -len(".best")] for c in columns if str(c).endswith(".best")]
    config_cols = [c for c in columns if c not in fixed and c not in metrics and not str(c).endswith(".best")]
    out = []
    for rec in runs.to_dict("records"):
        clean = {k: (None if isinstance(v, float) and v != v else v) for k, v in rec.items()}
        clean = {k: (None if str(v) == "<NA>" else v) for k, v in clean.items()}
        out.append(
            {
                "run": clean.get("run"),
                "key": None,
                "item": clean.get("item"),
                "name": clean.get("name"),
                "state": clean.get("state"),
                "duration": clean.get("duration"),
                "config": {c: clean.get(c) for c in config_cols if clean.get(c) is not None},
                "final": {m: clean.get(m) for m in metrics},
                "best": {m: clean.get(f"{m}.best") for m in metrics},
            }
        )
    return out


def show_runs(
    runs: Any = None,
    *,
    topic: str | None = None,
    notebook: str | None = None,
    run: str | None = None,
    every: bool = False,
) -> Any:
    """The sweep table: one row per sweep item (or run) with its config and final/best metrics.

    Sort by a click on a column, filter (``lr>0.01 aux=True``), tick rows to
    overlay their curves, group by a config key (mean ± sd bands), and read
    config -> metric in parallel coordinates.  Without ``runs`` it follows
    this kernel's runs as they start and report.

    Parameters
    ----------
    runs : pandas.DataFrame or list of dict, optional
        What :func:`jupyter_cluster.runs` returned (a fixed table).  Default:
        this kernel's runs, live.
    topic : str, optional
        The metrics topic the curves come from (default: every topic).
    notebook, run : str, optional
        Only the runs of this notebook path, or this run id.
    every : bool, default False
        Follow every run of this kernel, later ones too.  By default a live
        table shows the run it was made for: the newest one then (the sweep
        of the cell above), or, made before any run, the first that starts.

    Returns
    -------
    SweepWidget
        In a kernel with ipywidgets; elsewhere the DataFrame of :func:`jupyter_cluster.runs`.

    Examples
    --------
    >>> import jupyter_cluster as jc
    >>> jc.show_runs(topic="sweep")   # doctest: +SKIP
    """
    if topic is not None and (not isinstance(topic, str) or not topic):
        raise TypeError(f"show_runs(): topic must be a non-empty string, not {topic!r}.")
    rows = _rows_from(runs) if runs is not None else None
    where: dict[str, Any] = {"notebook": notebook, "run": run}
    if rows is None and notebook is None and run is None and not every:
        from ..tracking.record import kept_jobs
        from ..tracking.table import group_runs

        where["pin"] = RunPin(group_runs(kept_jobs()).values())
    if not (context.in_kernel() and context.widgets_available()):
        from ..tracking.table import frame

        return frame(rows if rows is not None else current_rows(**where))
    return widget_class()(rows, where, topic, topic or "runs")
