"""Progress of map jobs: one model, renderers picked by context, a job topic.

Like distributed's ``ProgressBar`` the *model* (:class:`JobProgress`: counts,
rate, elapsed, ETA) is separate from the renderers: a one-line
:class:`TextRenderer` (terminal IPython, or a kernel without ipywidgets) and a
:class:`WidgetRenderer` (ipywidgets in a kernel).  A renderer appears only
once a job has lasted ``jupyter-cluster.progress.delay`` (1 s), so quick maps
print nothing.

Every job is also published on the Dask topic :data:`.topics.JOBS_TOPIC`
through the submitting client, so the JupyterLab sidebar can show maps
started in any kernel.

The map engine calls :func:`observer_factory` for each job (registered with
``mapping.add_observer_factory`` by :func:`install`).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import config
from .._core import context, ticker
from ..state.registry import current_kernel_id
from ..telemetry.hub import attach, attached
from ..telemetry.producer import current_handle, publish
from ..telemetry.topic_names import JOBS_TOPIC
from ..wire import static_output
from ..wire.models import MAX_JOB_FAILURES, JobFailure, JobMessage, job_failure, job_message
from .cell_names import cell_names

if TYPE_CHECKING:
    from distributed import Client

logger = logging.getLogger(__name__)

#: seconds between renders while a job runs (widgets / text)
WIDGET_INTERVAL = 0.1
TEXT_INTERVAL = 0.25
#: seconds between job messages on the jobs topic
PUBLISH_INTERVAL = 0.25  # the panel refreshes every 250 ms: publishing slower made it lag the notebook

#: the most recent observers (newest last), for inspection and tests
recent: deque[ProgressObserver] = deque(maxlen=16)

# None = choose by context; "widget", "text" or "none" forces one (tests, benchmarks)
_forced_renderer: str | None = None


def set_renderer(kind: str | None) -> None:
    """Force the renderer: ``"widget"``, ``"text"``, ``"none"``, or None to choose by context."""
    global _forced_renderer
    if kind not in (None, "widget", "text", "none"):
        raise ValueError(f"renderer must be 'widget', 'text', 'none' or None, not {kind!r}.")
    _forced_renderer = kind


def _delay() -> float:
    from dask.utils import parse_timedelta

    value = config.get("progress.delay")
    return 1.0 if value is None else float(parse_timedelta(value))


def _publish_enabled() -> bool:
    value = config.get("progress.publish")
    return True if value is None else bool(value)


# -- the model ----------------------------------------------------------------------
def job_state(job: Any) -> str:
    """``"running"``, ``"finished"``, ``"failed"`` or ``"cancelled"`` for a map job."""
    state = getattr(job, "state", None)  # MapJob and SpmdJob keep it current
    return state if state in ("running", "finished", "failed", "cancelled") else "running"


def _job_ref(job: Any) -> Callable[[], Any]:
    """A weak reference to ``job`` where it takes one (a strong one otherwise, dropped when it ends).

    Observers outlive their jobs (:data:`recent`, the ticker until its next
    tick); a strong reference kept a finished map's results alive for as long.
    """
    try:
        return weakref.ref(job)
    except TypeError:
        return lambda: job


def _gone() -> None:
    return None


class JobProgress:
    """Counts, rate, elapsed time and ETA of one map job.

    It refers to the job weakly and keeps its last snapshot, so a job whose
    caller dropped it (and its results) is not kept alive by its progress.

    Parameters
    ----------
    job : MapJob
        Anything with ``id``, ``label``, ``total``, ``done``, ``failed``,
        ``started`` and ``finished``.
    """

    def __init__(self, job: Any) -> None:
        self._job = _job_ref(job)
        self.started = float(getattr(job, "started", None) or time.time())
        self.ended: float | None = None
        self._last: dict[str, Any] | None = None

    @property
    def job(self) -> Any:
        """The job, or None once it is gone."""
        return self._job()

    def release(self) -> None:
        """The job ended: a job held strongly (one that takes no weak reference) is let go.

        :meth:`snapshot` answers its last state from then on.
        """
        if isinstance(self._job, weakref.ref):
            return
        if self._job() is not None:
            self.snapshot()
        self._job = _gone

    def snapshot(self) -> dict[str, Any]:
        """The job's progress now, as a plain dict (its last one once the job is gone)."""
        job = self._job()
        if job is None:
            return self._final()
        total = getattr(job, "total", None)
        done = int(getattr(job, "done", 0) or 0)
        failed = int(getattr(job, "failed", 0) or 0)
        state = job_state(job)
        if state != "running" and self.ended is None:
            self.ended = float(getattr(job, "ended", None) or time.time())
        now = self.ended if self.ended is not None else time.time()
        elapsed = max(0.0, now - self.started)
        processed = done + failed
        rate = processed / elapsed if elapsed > 0 else 0.0
        eta = None
        if total is not None and state == "running" and rate > 0:
            eta = max(0.0, (total - processed) / rate)
        self._last = {
            "job": str(getattr(job, "id", "")),
            "label": str(getattr(job, "label", None) or "map"),
            "total": total,
            "done": done,
            "failed": failed,
            "processed": processed,
            "state": state,
            "started": self.started,
            "elapsed": elapsed,
            "rate": rate,
            "eta": eta,
        }
        return dict(self._last)

    def _final(self) -> dict[str, Any]:
        """The last snapshot of a job that is gone; one dropped while it ran was abandoned, so it reads cancelled."""
        last = dict(self._last) if self._last is not None else {
            "job": "", "label": "map", "total": None, "done": 0, "failed": 0, "processed": 0,
            "state": "running", "started": self.started, "elapsed": 0.0, "rate": 0.0, "eta": None,
        }  # fmt: skip
        if last["state"] == "running":
            if self.ended is None:
                self.ended = time.time()
            last.update(state="cancelled", eta=None, elapsed=max(0.0, self.ended - self.started))
            self._last = dict(last)
        return last


def failures_of(job: Any) -> list[JobFailure]:
    """The first failed items of a job (index, error, traceback's last lines, worker), bounded."""
    errors = getattr(job, "errors", None)
    if not isinstance(errors, dict) or not errors:
        return []
    tracebacks = getattr(job, "tracebacks", None) or {}
    items = getattr(job, "failed_items", None) or {}
    try:
        first = sorted(errors)[:MAX_JOB_FAILURES]
    except RuntimeError:  # the map thread added one meanwhile; the next update carries it
        return []
    out = []
    for index in first:
        tb = tracebacks.get(index)
        text = tb[0] if isinstance(tb, tuple) and tb else ""
        where = items.get(index)
        worker = where[1] if isinstance(where, tuple) and len(where) > 1 else None
        item = where[0] if isinstance(where, tuple) and where else None
        try:
            # the cells named as the notebook names them (Cell In[4], line 5), the item by its value too
            out.append(job_failure(index, errors[index], cell_names(text), worker, item))
        except Exception:  # a failure that cannot be described must not stop the progress
            continue
    return out


def _fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def format_line(snap: dict[str, Any], width: int = 20) -> str:
    """One line of text: bar, items processed/total (failed ones included), failed, rate, elapsed, ETA."""
    total, done = snap["total"], snap["processed"]
    if total:
        filled = int(width * min(done, total) / total)
        bar = f"[{'#' * filled}{' ' * (width - filled)}] " if width else ""
        head = f"{bar}{done:,}/{total:,} ({100 * done / total:.0f} %)"
    else:
        head = f"{done:,} done" if total is None else f"{done:,}/0"
    parts = [f"{snap['label']}: {head}"]
    if snap["failed"]:
        parts.append(f"{snap['failed']:,} failed")
    parts.append(f"{snap['rate']:.1f}/s")
    parts.append(f"elapsed {_fmt_time(snap['elapsed'])}")
    if snap["state"] == "running":
        if snap["eta"] is not None:
            parts.append(f"ETA {_fmt_time(snap['eta'])}")
    else:
        parts.append(snap["state"])
    return " | ".join(parts)


# -- renderers -----------------------------------------------------------------------
class TextRenderer:
    """One line of text, rewritten in place with a carriage return."""

    interval = TEXT_INTERVAL

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream
        self._width = 0
        self.last_line = ""

    def _out(self):
        return self.stream if self.stream is not None else sys.stdout

    def update(self, snap: dict[str, Any]) -> None:
        line = format_line(snap)
        pad = max(0, self._width - len(line))
        self._width = len(line)
        self.last_line = line
        out = self._out()
        out.write("\r" + line + " " * pad)
        out.flush()

    def close(self, snap: dict[str, Any]) -> None:
        self.update(snap)
        self._out().write("\n")
        self._out().flush()


class WidgetRenderer:
    """An ipywidgets progress bar with a label; displayed on the first update.

    Its output carries the line as static text and HTML beside the widget, and
    when the job ends the output becomes that static final line alone (the
    widgets are closed), so a saved notebook shows it without the kernel.
    """

    interval = WIDGET_INTERVAL

    def __init__(self) -> None:
        import ipywidgets as w

        self.bar = w.IntProgress(min=0, max=1, value=0, layout=w.Layout(width="260px"))
        self.label = w.HTML()
        self.box = w.HBox([self.bar, self.label])
        self._displayed = False
        self.display_id = f"jupyter-cluster-progress-{self.box.model_id}"

    @staticmethod
    def static(snap: dict[str, Any]) -> dict[str, str]:
        """The line as ``text/plain`` and ``text/html`` (what a reader without the kernel sees)."""
        line = format_line(snap, width=0)
        total = snap["total"]
        fraction = min(snap["processed"], total) / total if total else None
        failed = min(snap["failed"], total) / total if total else 0.0
        # a line of its own, as the text renderer ends it (text after it in the cell starts a new line)
        return {
            "text/plain": format_line(snap) + "\n",
            "text/html": static_output.progress_html(line, snap["state"], fraction, failed),
        }

    def update(self, snap: dict[str, Any]) -> None:
        total = snap["total"]
        self.bar.layout.display = None if total else "none"
        if total:
            self.bar.max = max(1, total)
            self.bar.value = min(snap["processed"], total)
        style = {"running": "", "finished": "success", "failed": "danger", "cancelled": "warning"}[snap["state"]]
        if snap["failed"]:
            style = "danger"  # failed items (--errors collect): red, as the panel's bar, not green or amber
        self.bar.bar_style = style
        import html

        self.label.value = f"<span style='font-family: monospace'>{html.escape(format_line(snap, width=0))}</span>"
        if not self._displayed:
            self._displayed = True
            from IPython.display import display

            data = static_output.bundle(self.box, self.static(snap))
            display(data, raw=True, metadata=static_output.metadata(), display_id=self.display_id)

    def close(self, snap: dict[str, Any]) -> None:
        self.update(snap)
        try:
            static_output.replace(self.display_id, self.static(snap))
        except Exception:  # the live bar stays; a static copy must never fail a map
            logger.debug("static progress line failed", exc_info=True)
            return
        for widget in (self.box, self.bar, self.label):
            widget.close()


def make_renderer() -> TextRenderer | WidgetRenderer | None:
    """The renderer for this context (widget in a kernel with ipywidgets, else text)."""
    kind = _forced_renderer
    if kind is None:
        kind = "widget" if context.in_kernel() and context.widgets_available() else "text"
    if kind == "none":
        return None
    if kind == "widget":
        return WidgetRenderer()
    return TextRenderer()


# -- the observer the map engine drives ----------------------------------------------
def _cluster_name(client: Client) -> str | None:
    """The name of the kernel's current cluster when ``client`` is its client (else None)."""
    handle = current_handle()
    return handle.name if handle is not None and handle.client is client else None


def _job_client(job: Any) -> Client | None:
    """The client a job runs through (every map and SPMD job carries its own)."""
    return getattr(job, "client", None)


class ProgressObserver:
    """Follows one map job: renders it (after a delay) and publishes it.

    Parameters
    ----------
    job : MapJob
    show : bool
        Render at all (False for ``progress=False``).
    delay : float
        Seconds a job must last before its renderer appears.
    renderer_factory : callable
        Makes the renderer when it is first needed.
    publish : bool
        Log job messages on the jobs topic through the job's client.
    """

    def __init__(
        self,
        job: Any,
        show: bool = True,
        delay: float = 1.0,
        renderer_factory: Callable[[], Any] = make_renderer,
        publish: bool = True,
    ) -> None:
        self.model = JobProgress(job)
        self.show = show
        self.delay = delay
        self._factory = renderer_factory
        self.renderer: Any = None
        self.client = _job_client(job) if publish else None
        cluster = getattr(job, "cluster", None)
        self.cluster = (
            cluster if isinstance(cluster, str) else (_cluster_name(self.client) if self.client is not None else None)
        )
        #: the panel follows the active notebook to the cluster its maps run on
        self.kernel_id = current_kernel_id() if self.client is not None else None
        #: the run fields of its messages: run, kind, notebook, cell, config (jupyter_cluster.tracking.runs)
        self.context: dict[str, Any] = _run_context(job)
        self._lock = threading.Lock()
        self._last_render = 0.0
        self._last_publish = 0.0
        self._published_done = -1
        self._closed = False
        self.published: list[JobMessage] = []  # what this observer sent on the jobs topic (kept small)
        self._failures: list[JobFailure] = []  # the job's failures as last published (text only)
        recent.append(self)

    @property
    def job(self) -> Any:
        """The job followed, or None once it is gone (an observer never keeps a job, or its results, alive)."""
        return self.model.job

    # -- rendering -------------------------------------------------------------------
    def _render(self, final: bool = False) -> None:
        snap = self.model.snapshot()
        if self.renderer is None:
            if (
                not self.show
                or (not final and snap["elapsed"] < self.delay)
                or (final and snap["elapsed"] < self.delay)
            ):
                return
            self.renderer = self._factory()
            if self.renderer is None:
                self.show = False
                return
        if final:
            self.renderer.close(snap)
        else:
            self.renderer.update(snap)
        self._last_render = time.monotonic()

    def _publish(self, force: bool = False) -> None:
        if self.client is None:
            return
        now = time.monotonic()
        job = self.job
        if job is not None:
            done = int(getattr(job, "done", 0) or 0) + int(getattr(job, "failed", 0) or 0)
        else:
            done = self.model.snapshot()["processed"]
        if not force and (now - self._last_publish < PUBLISH_INTERVAL or done == self._published_done):
            return
        self._last_publish = now
        self._published_done = done
        if job is not None:
            self._failures = failures_of(job)
        del job  # not held through the publish (it may wait on the client's loop)
        snap = self.model.snapshot()
        msg = job_message(
            job=snap["job"],
            label=snap["label"],
            kernel=os.getpid(),
            cluster=self.cluster,
            total=snap["total"],
            done=snap["done"],
            failed=snap["failed"],
            state=snap["state"],
            started=snap["started"],
            updated=time.time(),
            failures=self._failures,
            kernel_id=self.kernel_id,
        )
        msg.update(self.context)  # type: ignore[typeddict-item]
        if snap["state"] != "running":
            msg.update(_run_items(self.job))  # type: ignore[typeddict-item]
        _keep_run(msg)
        if len(self.published) < 64 or force:
            self.published.append(msg)
        publish(self.client, JOBS_TOPIC, msg)

    def _tick(self) -> bool:
        if self.model.job is None:  # dropped unfinished (an abandoned imap): end its display as cancelled
            self._close()
            return False
        with self._lock:
            if self._closed:
                return False
            if self.renderer is not None or self.show:
                self._render()
            self._publish()
        return True

    def _close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._render(final=True)
            self._publish(force=True)
            self.model.release()

    # -- the observer interface of mapping -------------------------------------------
    def job_started(self, job: Any) -> None:
        with self._lock:
            self._publish(force=True)
        if self.show and self.delay <= 0:
            with self._lock:
                self._render()
        ticker.every(0.25, self._tick)

    def job_progress(self, job: Any) -> None:
        with self._lock:
            if self._closed:
                return
            if self.renderer is not None and time.monotonic() - self._last_render >= self.renderer.interval:
                self._render()
            self._publish()

    def job_finished(self, job: Any) -> None:
        self._close()

    @property
    def shown(self) -> bool:
        """Whether a renderer appeared (the job outlasted the delay)."""
        return self.renderer is not None


def _run_context(job: Any) -> dict[str, Any]:
    try:
        from .record import job_context

        return job_context(job)
    except Exception:  # a run record that cannot be made must not stop the map
        logger.debug("no run context for job", exc_info=True)
        return {}


def _run_items(job: Any) -> dict[str, Any]:
    if job is None:
        return {}
    try:
        from .record import job_items

        return job_items(job)
    except Exception:
        logger.debug("no run items for job", exc_info=True)
        return {}


def _keep_run(msg: Any) -> None:
    from .record import keep

    keep(msg)


def observer_factory(job: Any, progress: Any = None) -> ProgressObserver | None:
    """The map engine's hook: an observer for ``job``.

    ``progress`` is the user's argument: None (auto: appears after the delay),
    True (appears at once) or False (nothing shown; the job is still
    published for the sidebar unless ``jupyter-cluster.progress.publish`` is
    false).
    """
    publish = _publish_enabled()
    if progress is False and not publish:
        return None
    client = _job_client(job) if publish else None
    if client is not None:
        _attach_metrics(client)
    return ProgressObserver(
        job,
        show=progress is not False,
        delay=0.0 if progress is True else _delay(),
        publish=publish,
    )


def _attach_metrics(client: Client) -> None:
    """Collect metrics from the job's cluster without delaying the job."""
    if attached(client):
        return
    threading.Thread(target=_attach_quietly, args=(client,), name="jupyter-cluster-attach", daemon=True).start()


def _attach_quietly(client: Client) -> None:
    try:
        attach(client)
    except Exception:
        logger.debug("metrics subscription failed", exc_info=True)


_installed = False


def install(add_observer_factory: Callable[[Callable], None]) -> bool:
    """Register :func:`observer_factory` with the map engine through its ``add_observer_factory`` (idempotent)."""
    global _installed
    if _installed:
        return True
    add_observer_factory(observer_factory)
    _installed = True
    return True
