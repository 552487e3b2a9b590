"""Live metric charts in the notebook (and a text summary where charts can't go).

The charts are drawn by the ES module ``static/metrics.js``, bundled from the
same TypeScript chart code the JupyterLab sidebar uses
(``labextension/src/charts``).  The Python side only keeps the ``data`` trait
up to date with :meth:`TopicStore.model` (the shared metrics data model,
downsampled so 100 series x 10,000 points stay light in the browser), pushed
from the ticker thread at most every ``jupyter-cluster.metrics.refresh``
(400 ms) and only when something changed, so the kernel is never blocked.

Its output also carries a static copy of the charts (SVG images in
``text/html``, the text summary in ``text/plain``), updated at the end of each
cell, so a saved notebook, nbviewer and GitHub show the curves without the
kernel (:mod:`.static_render`).
"""

from __future__ import annotations

import html
import pathlib
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, cast

from .. import config, mapping, telemetry
from .._core import context, ticker
from ..errors import CellError
from ..telemetry.producer import current_handle
from .anywidgets import built_once

STATIC = pathlib.Path(__file__).parent / "static"
BUNDLE = STATIC / "metrics.js"

MISSING_BUNDLE = (
    "Live charts need the widget bundle jupyter_cluster/widgets/static/metrics.js, which is not built; "
    "build it with `jlpm build:widget` (or `npm run build:widget`) in the source tree, or reinstall jupyter-cluster. "
    "Showing a text summary instead."
)


def _refresh_seconds() -> float:
    from dask.utils import parse_timedelta

    value = config.get("metrics.refresh")
    return 0.4 if value is None else float(parse_timedelta(value))


class _Follower:
    """Pushes a store's changes into ``sink`` from the ticker, throttled; stops when ``alive()`` is False."""

    def __init__(
        self, st: telemetry.TopicStore, sink: Callable[[telemetry.TopicStore], None], alive: Callable[[], bool]
    ) -> None:
        self.store = st
        self.sink = sink
        self.alive = alive
        self.version = -1
        self.pushes = 0
        self._last = 0.0
        self._cost = 0.0
        self._lock = threading.Lock()

    def push(self, force: bool = False) -> bool:
        """Send the store's state to the sink if it changed (or ``force``); True if sent."""
        with self._lock:
            version = self.store.version
            if not force and version == self.version:
                return False
            self.version = version
            t0 = time.monotonic()
            self.sink(self.store)
            self._last = time.monotonic()
            self._cost = self._last - t0
            self.pushes += 1
            return True

    def tick(self) -> bool:
        if not self.alive():
            return False
        # a big topic that takes long to downsample is pushed less often, so
        # the kernel never spends more than ~a quarter of its time on charts
        if time.monotonic() - self._last >= 3 * self._cost:
            self.push()
        return True

    def start(self) -> _Follower:
        self.push(force=True)
        ticker.every(_refresh_seconds(), self.tick)
        _live.add(self)
        _install_flush_hooks()
        return self


# -- flushing when a map or a cell ends ----------------------------------------------
# The ticker pushes at most every ~0.4 s from its own thread.  A push that comes after
# the cell has finished is not part of that cell's output any more, so the notebook
# saved at the end (nbclient, or the last save in JupyterLab) missed the last points.
# These hooks push what is pending while the cell is still running, on its thread.
_live: weakref.WeakSet[_Follower] = weakref.WeakSet()
_hooks_lock = threading.Lock()
_hooks_installed = False
_map_ended = False
#: seconds a cell end waits for reports already at the scheduler (only after a map)
SYNC_TIMEOUT = 1.0


def flush_charts(sync: bool = False) -> int:
    """Push every open chart's pending update now, on the calling thread.

    Parameters
    ----------
    sync : bool
        First have the workers send what they still buffer and wait (at most
        :data:`SYNC_TIMEOUT` s per step) until those reports and the others
        the scheduler has, e.g. from a map that just ended, are in this kernel.

    Returns
    -------
    int
        How many charts were updated.
    """
    followers = [f for f in list(_live) if f.alive()]
    if not followers:
        return 0
    if sync:
        telemetry.sync(SYNC_TIMEOUT, workers=True)
    return sum(1 for f in followers if f.push())


class _MapEnd:
    """Map-engine observer: push the charts when a map ends; the cell end then waits for stragglers."""

    def job_finished(self, job: Any) -> None:
        global _map_ended
        _map_ended = True
        flush_charts()


def _map_observer(job: Any, progress: Any = None) -> _MapEnd | None:
    return _MapEnd() if len(_live) else None


def _after_cell(result: Any = None) -> None:
    global _map_ended
    sync, _map_ended = _map_ended, False
    try:
        flush_charts(sync=sync)
        # the static copies too, now that the stragglers are in (static_render's own
        # cell-end hook may have run before this one; an unchanged chart is not redrawn)
        from . import static_render

        static_render.refresh()
    except Exception:  # a chart must never turn a finished cell into a failed one
        import logging

        logging.getLogger(__name__).debug("chart flush at the end of the cell failed", exc_info=True)


def _install_flush_hooks() -> None:
    """Flush the charts when a map ends and when an IPython cell ends (once per process)."""
    global _hooks_installed
    with _hooks_lock:
        if _hooks_installed:
            return
        _hooks_installed = True
    try:
        mapping.add_observer_factory(_map_observer)
    except (ImportError, AttributeError):
        pass
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is not None:
        shell.events.register("post_run_cell", _after_cell)


_widget_class: Any = None


def widget_class():
    """The anywidget class of the chart (built on first use; needs the JS bundle)."""
    global _widget_class
    _widget_class = built_once(_widget_class, BUNDLE, MISSING_BUNDLE, _build_widget_class)
    return _widget_class


def _build_widget_class() -> type:
    import anywidget
    import traitlets as t

    from .static_render import StaticOutput, metrics_html

    class MetricsWidget(StaticOutput, anywidget.AnyWidget):
        """Live charts of one metrics topic: a line chart per scalar, a heatmap per vector.

        Displayed, its output also holds a static copy of the charts as of the
        end of the last cell (see :mod:`jupyter_cluster.widgets.static_render`).
        """

        _esm = BUNDLE
        topic = t.Unicode("").tag(sync=True)
        data = t.Dict().tag(sync=True)
        chart_height = t.Int(260).tag(sync=True)
        #: the browser's toolbar choices (smoothing, y scale, ...), so a re-rendered output keeps them
        view_state = t.Dict().tag(sync=True)

        def __init__(self, topic: str, **kwargs: Any) -> None:
            super().__init__(
                topic=topic, data={"topic": topic, "scalars": {}, "vectors": {}, "dropped": 0, "received": 0}, **kwargs
            )
            self.follower = _Follower(telemetry.store(topic), self._push, lambda: self.comm is not None).start()

        def _push(self, st: telemetry.TopicStore) -> None:
            self.data = cast(dict, st.model())  # a MetricsModel (TypedDict) for the traitlet

        def static_version(self) -> Any:
            return telemetry.store(self.topic).version

        def static_bundle(self) -> dict[str, str]:
            st = telemetry.store(self.topic)
            return {"text/plain": st.summary(), "text/html": metrics_html(st.model())}

    return MetricsWidget


class MetricsText:
    """A plain-text view of a topic: the latest value of each series.

    What :func:`show_metrics` gives in a terminal (or where charts are not
    available).  ``repr()`` is the summary at the time it is asked for.
    """

    def __init__(self, topic: str, note: str | None = None) -> None:
        self.topic = topic
        self.note = note

    def summary(self) -> str:
        text = telemetry.store(self.topic).summary()
        return f"{self.note}\n{text}" if self.note else text

    def __repr__(self) -> str:
        return self.summary()

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(self.summary())


def _text_widget(topic: str, note: str | None):
    """An ipywidgets HTML box with the live text summary (kernel without the chart bundle)."""
    import ipywidgets as w

    box = w.HTML()

    def sink(st: telemetry.TopicStore) -> None:
        text = st.summary()
        prefix = f"<p>{html.escape(note)}</p>" if note else ""
        box.value = f"{prefix}<pre>{html.escape(text)}</pre>"

    box.follower = _Follower(telemetry.store(topic), sink, lambda: box.comm is not None).start()
    return box


def show_metrics(topic: str = "default", cluster: Any = None):
    """Live charts of what tasks report on ``topic``.

    One line chart per scalar value with one line per series (e.g. reward per
    population member) and a heatmap per vector value over steps (e.g. tokens
    per expert).  The charts update a few times a second while reports
    arrive, without blocking the kernel.

    Parameters
    ----------
    topic : str
        As given to :func:`jupyter_cluster.report`.
    cluster : ClusterHandle, optional
        Where the reports come from; defaults to the current cluster (reports
        made in the notebook are shown without a cluster).

    Returns
    -------
    MetricsWidget, ipywidgets.HTML or MetricsText
        The chart widget in a kernel; a live text summary when the chart
        bundle is not built (with one message saying so); a text summary
        in a terminal.
    """
    if not isinstance(topic, str) or not topic:
        raise TypeError(f"show_metrics(): topic must be a non-empty string, not {topic!r}.")
    handle = cluster if cluster is not None else current_handle()
    if handle is not None and not handle.closed:
        telemetry.attach(handle.client)
    telemetry.store(topic)
    if not (context.in_kernel() and context.widgets_available()):
        return MetricsText(topic)
    try:
        cls = widget_class()
    except FileNotFoundError:
        return _text_widget(topic, MISSING_BUNDLE)
    return cls(topic)


def metrics_command(shell: Any, argv: list[str]):
    """``%cluster metrics [TOPIC]``: show live charts of a topic (``default`` if omitted)."""
    if len(argv) > 1:
        raise CellError("usage: %cluster metrics [TOPIC]  (one topic name, e.g. %cluster metrics es)")
    topic = argv[0] if argv else "default"
    if topic in ("-h", "--help"):
        known = ", ".join(telemetry.topics()) or "none yet"
        print(f"%cluster metrics [TOPIC]   live charts of a metrics topic (known: {known})")
        return None
    return show_metrics(topic)
