"""The cluster widget: a live view of one cluster with scale and adapt controls.

It is what a :class:`~jupyter_cluster.cluster.session.ClusterHandle` (and ``%cluster``)
shows in a kernel with ipywidgets.  Everything it draws comes from
``ClusterHandle.model()``, refreshed every couple of seconds from the ticker
thread (one scheduler query per cluster per refresh, however many widgets
show it), so the kernel stays free.  Its output also carries the header and
the workers table as static HTML and text, so a saved notebook shows the
cluster it ran on without the kernel (:mod:`.static_render`).
"""

from __future__ import annotations

import html
import threading
import time
import weakref
from typing import Any

import ipywidgets as w

from .._core import context, ticker
from ..cluster.display import fmt_bytes, text_status
from ..errors import ClusterError
from . import static_render

REFRESH_SECONDS = 2.0

_live_lock = threading.Lock()
_live: dict[int, weakref.WeakSet[ClusterWidget]] = {}


def _bar(fraction: float, text: str) -> str:
    pct = max(0.0, min(1.0, fraction)) * 100
    colour = "#d9534f" if pct > 85 else ("#f0ad4e" if pct > 60 else "#5cb85c")
    return (
        "<div style='position:relative;min-width:190px;height:1.3em;background:var(--jp-layout-color2,#eee);border-radius:2px'>"
        f"<div style='width:{pct:.0f}%;height:100%;background:{colour};border-radius:2px'></div>"
        f"<span style='position:absolute;left:6px;top:0;font-size:0.85em;line-height:1.5em;white-space:nowrap'>{html.escape(text)}</span></div>"
    )


#: every cell: room between columns, one line each, numbers right-aligned
_CELL = "padding:2px 12px;white-space:nowrap"
_TD = f"<td style='{_CELL}'>"
_NUM = f"<td style='{_CELL};text-align:right'>"


def workers_table(m: dict[str, Any]) -> str:
    """HTML: one row per worker (name, status, threads, memory, CPU, tasks) and a totals row.

    A batch cluster's (``m["batch"]``) rows also show each worker's job id, node and walltime left.
    """
    batch = isinstance(m.get("batch"), dict)
    rows = []
    for wk in m["workers"]:
        mem, lim = wk.get("memory") or 0, wk.get("memory_limit") or 0
        jobs = ""
        if batch:
            jobs = "".join(f"{_TD}{html.escape(str(wk.get(k) or '-'))}</td>" for k in ("job_id", "node"))
            jobs += f"{_NUM}{html.escape(str(wk.get('walltime_left') or '-'))}</td>"
        rows.append(
            "<tr>"
            f"{_TD}{html.escape(str(wk['name']))}</td>{_TD}{html.escape(str(wk['status']))}</td>"
            f"{jobs}"
            f"{_NUM}{wk['nthreads']}</td>"
            f"{_TD}{_bar(mem / lim if lim else 0.0, f'{fmt_bytes(mem)} / {fmt_bytes(lim)}')}</td>"
            f"{_NUM}{wk.get('cpu') or 0:.0f} %</td>"
            f"{_NUM}{wk.get('executing') or 0}{_idle_note(wk)}</td>"
            "</tr>"
        )
    cpu = sum(wk.get("cpu") or 0 for wk in m["workers"])
    tasks = sum(wk.get("executing") or 0 for wk in m["workers"])
    rows.append(
        "<tr style='font-weight:bold;border-top:1px solid var(--jp-border-color2,#ccc)'>"
        f"{_TD}total</td>{_TD}{m['n_workers']} workers</td>{'<td></td>' * 3 if batch else ''}{_NUM}{m['cores']}</td>"
        f"{_TD}{html.escape(fmt_bytes(m.get('memory')))} / {html.escape(fmt_bytes(m.get('memory_limit')))}</td>"
        f"{_NUM}{cpu:.0f} %</td>{_NUM}{tasks}</td>"
        "</tr>"
    )
    heads = [
        ("worker", "left"),
        ("status", "left"),
        *([("job", "left"), ("node", "left"), ("walltime left", "right")] if batch else []),
        ("threads", "right"),
        ("memory (used / limit)", "left"),
        ("CPU", "right"),
        ("tasks running", "right"),
    ]
    head = "".join(f"<th style='{_CELL};text-align:{align}'>{name}</th>" for name, align in heads)
    return (
        "<table class='jupyter-cluster-workers' style='border-collapse:collapse'>"
        f"<thead><tr style='border-bottom:1px solid var(--jp-border-color2,#ccc)'>{head}</tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _idle_note(wk: dict[str, Any]) -> str:
    """ " (+2 idle)" after a worker's running tasks when it holds leases that wait for a map."""
    idle = int(wk.get("idle_leases") or 0)
    return f" <span style='opacity:0.6' title='leases waiting for a map'>(+{idle} idle)</span>" if idle else ""


def batch_text(m: dict[str, Any]) -> str:
    """One line on a batch cluster's jobs (``m["batch"]``, as the sidebar has them), or "" for other clusters.

    E.g. ``slurm jobs: 2 running, 1 pending (job 17: Resources); walltime left 9:12 (squeue at 03:40:02 UTC)``.
    """
    b = m.get("batch")
    if not isinstance(b, dict):
        return ""
    pending = b.get("pending_jobs") or []
    text = f"{b.get('system') or 'batch'} jobs: {b.get('running', 0)} running, {b.get('pending', 0)} pending"
    if pending:
        shown = ", ".join(f"job {p.get('job_id')}: {p.get('reason') or 'no reason given'}" for p in pending[:5])
        text += f" ({shown}{', ...' if len(pending) > 5 else ''})"
    if b.get("walltime_left"):
        text += f"; walltime left {b['walltime_left']}"
    if isinstance(b.get("updated"), (int, float)):
        text += f" (squeue at {time.strftime('%H:%M:%S UTC', time.gmtime(b['updated']))})"
    return text


def header_html(m: dict[str, Any]) -> str:
    link = m.get("dashboard_link")
    dash = f"<a href='{html.escape(link)}' target='_blank'>{html.escape(link)}</a>" if link else "-"
    return (
        f"<b>{html.escape(m['name'])}</b> ({html.escape(m['backend'])}) "
        f"<code>{html.escape(m['address'])}</code> &nbsp; Dashboard: {dash}"
        + (f"<div class='jupyter-cluster-batch'>{html.escape(batch_text(m))}</div>" if batch_text(m) else "")
    )


class ClusterWidget(static_render.StaticOutput, w.VBox):
    """Live status of a cluster: workers table, totals, dashboard link, scale and adapt.

    Parameters
    ----------
    handle : ClusterHandle
    live : bool
        Refresh every couple of seconds while the cluster runs and the widget
        is open.

    Attributes
    ----------
    model_data : dict
        The last ``handle.model()`` read (``{}`` before the first; kept once the cluster stops,
        for the static copy).
    """

    def __init__(self, handle: Any, live: bool = True, **kwargs: Any) -> None:
        self.handle = handle
        self.model_data: dict[str, Any] = {}
        self.header = w.HTML()
        self.table = w.HTML()
        self.message = w.HTML()
        self.scale_n = w.BoundedIntText(
            value=0, min=0, max=100_000, description="workers", layout=w.Layout(width="170px")
        )
        self.scale_button = w.Button(description="Scale", tooltip="ask for this many workers")
        self.adapt_min = w.BoundedIntText(
            value=0, min=0, max=100_000, description="min", layout=w.Layout(width="130px")
        )
        self.adapt_max = w.BoundedIntText(
            value=4, min=0, max=100_000, description="max", layout=w.Layout(width="130px")
        )
        self.adapt_button = w.Button(description="Adapt", tooltip="let the number of workers follow the load")
        self.scale_button.on_click(lambda _: self.scale(self.scale_n.value))
        self.adapt_button.on_click(lambda _: self.adapt(self.adapt_min.value, self.adapt_max.value))
        if getattr(handle, "owns_cluster", True):
            self.controls: w.Widget = w.HBox(
                [self.scale_n, self.scale_button, self.adapt_min, self.adapt_max, self.adapt_button]
            )
        else:  # no controls that cannot work; say why instead
            how = getattr(handle, "attachment", "attached")
            self.controls = w.HTML(f"<i>{html.escape(f'{how}: scale or adapt it where it was started.')}</i>")
        super().__init__([self.header, self.table, self.controls, self.message], **kwargs)
        # count views where the front-end supports it, so a cleared output stops the refresh
        self._view_count = 0
        self._ever_viewed = False
        self.refresh()
        self.scale_n.value = self.model_data.get("n_workers", 0)
        if live:
            _follow(self)

    # -- state --------------------------------------------------------------------
    def refresh(self, model: dict[str, Any] | None = None) -> None:
        """Redraw from ``model`` (or a fresh ``handle.model()``)."""
        if model is None:
            model = _read_model(self.handle)
        if model is None:
            # model_data keeps the last model seen, for the static copy of a stopped cluster
            self.header.value = f"<b>{html.escape(self.handle.name)}</b> is stopped."
            self.table.value = ""
            return
        if "error" in model:
            self.message.value = f"<span style='color:#d9534f'>{html.escape(model['error'])}</span>"
            return
        self.model_data = model
        self.header.value = header_html(model)
        self.table.value = workers_table(model)

    @property
    def wanted(self) -> bool:
        """Whether live refreshes are still useful (open widget, running cluster, on screen)."""
        if self.comm is None or self.handle.closed:
            return False
        count = self._view_count
        if count:
            self._ever_viewed = True
        return not (self._ever_viewed and count == 0)

    # -- the static copy in the output -----------------------------------------------
    def static_bundle(self) -> dict[str, str]:
        """The header and workers table as HTML, the status as text (the last model seen)."""
        m = self.model_data
        if not m:
            text = f"{self.handle.name} is stopped."
            return {"text/plain": text, "text/html": f"<div class='jupyter-cluster-static'>{html.escape(text)}</div>"}
        stopped = "<div><i>stopped</i></div>" if self.handle.closed else ""
        return {
            "text/plain": text_status(m)
            + (f"\n{batch_text(m)}" if batch_text(m) else "")
            + ("\n(stopped)" if self.handle.closed else ""),
            "text/html": f"<div class='jupyter-cluster-static'>{header_html(m)}{workers_table(m)}{stopped}</div>",
        }

    def static_version(self) -> Any:
        return (self.header.value, self.table.value, self.handle.closed)

    # -- controls -------------------------------------------------------------------
    def _say(self, text: str, error: bool = False) -> None:
        colour = "#d9534f" if error else "inherit"
        self.message.value = f"<span style='color:{colour}'>{html.escape(text)}</span>"

    def scale(self, n: int) -> None:
        """Ask for ``n`` workers (what the Scale button does)."""
        try:
            self.handle.scale(int(n))
        except ClusterError as exc:
            self._say(str(exc), error=True)
            return
        self._say(f"scaling to {n} workers")

    def adapt(self, minimum: int, maximum: int) -> None:
        """Adapt between ``minimum`` and ``maximum`` workers (what the Adapt button does)."""
        try:
            self.handle.adapt(int(minimum), int(maximum))
        except ClusterError as exc:
            self._say(str(exc), error=True)
            return
        self._say(f"adapting between {minimum} and {maximum} workers")


def _read_model(handle: Any) -> dict[str, Any] | None:
    if handle.closed:
        return None
    try:
        model = dict(handle.model())
        _split_leases(handle, model)
        _add_backend_view(handle, model)
        return model
    except ClusterError:
        return None
    except Exception as exc:  # a vanished scheduler must not kill the refresh loop
        return {"error": f"cluster unreachable: {exc}"}


def _split_leases(handle: Any, model: dict[str, Any]) -> None:
    """Count idle leases as idle, not as running tasks (the sidebar's rule, :func:`..wire.leases.split_leases`).

    A lease whose worker reports it busy counts as running; one whose worker
    reports nothing counts as running only while a map of this kernel runs.
    """
    from ..engine.cluster import workers_now
    from ..wire.leases import busy_leases, lease_counts, split_leases

    try:
        processing = handle.client.processing()
        info = workers_now(handle.client)
    except Exception:  # an older scheduler or a vanished one: the raw counts stay
        return
    if isinstance(processing, dict):
        running = sum(1 for job in _running_jobs() if job)
        split_leases(model["workers"], lease_counts(processing), busy_leases(info), running)


def _running_jobs() -> list[Any]:
    """This kernel's map jobs that are running now (for workers that report no busy count)."""
    from ..tracking import progress

    return [o for o in list(progress.recent) if o.model.snapshot()["state"] == "running"]


def _add_backend_view(handle: Any, model: dict[str, Any]) -> None:
    """What the cluster's backend shows of it (``Backend.describe``): a batch cluster's jobs, say.

    The backend is the one the cluster's registry record names (also when this
    kernel only attached to it by name); one attached by address has none.
    """
    from ..backends import describer

    record = getattr(handle, "attached_record", None)
    describe = describer(record.backend if record is not None else handle.backend)
    if describe is None:
        return
    extra = getattr(handle, "extra", None) or (getattr(record, "extra", None) if record is not None else None) or {}
    handle.client.sync(describe, model, extra if isinstance(extra, dict) else {}, handle.client, callback_timeout=10)


def _follow(widget: ClusterWidget) -> None:
    key = id(widget.handle)
    with _live_lock:
        found = _live.get(key)
        new = found is None
        group = _live[key] = weakref.WeakSet() if found is None else found
        group.add(widget)
    if new:
        handle = widget.handle
        ticker.every(REFRESH_SECONDS, lambda: _refresh_group(key, handle))


def _refresh_group(key: int, handle: Any) -> bool:
    with _live_lock:
        group = _live.get(key)
        widgets = [x for x in (group or ()) if x.wanted]
        if not widgets:
            _live.pop(key, None)
    if not widgets:
        for x in list(group or ()):
            if handle.closed and x.comm is not None:
                x.refresh(None)
        return False
    model = _read_model(handle)
    for x in widgets:
        x.refresh(model)
    return True


def mimebundle(handle: Any, include: Any = None, exclude: Any = None) -> dict | tuple[dict, dict] | None:
    """What a :class:`ClusterHandle` shows: the live widget and its static copy in a kernel, text in a terminal.

    Returns None (IPython then falls back to the handle's static HTML) when
    the cluster is stopped.
    """
    if handle.closed:
        return None
    if not context.in_kernel():
        model = _read_model(handle)
        if model is None or "error" in model:
            return None
        return {"text/plain": text_status(model)}
    widget = ClusterWidget(handle)
    # the view and its static copy (as of now: a handle's display has no display id to update)
    return static_render.bundle(widget, widget.static_bundle()), static_render.metadata()
