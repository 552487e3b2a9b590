"""The launcher widget: pick a backend and a size, start, scale and stop a cluster.

The cluster it starts becomes the kernel's current one, so ``%%parallel``
cells and ``Pool`` below use it at once.  All lifecycle work goes through
:mod:`jupyter_cluster.cluster.session`; this module only lays out controls.  Its
output also carries a static copy (the status line and the cluster's table),
so a saved notebook shows what was started (:mod:`.static_render`).
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as w

from .. import backends, config
from ..cluster import session
from ..errors import ClusterError
from . import static_render
from .cluster import ClusterWidget


def _default_workers(backend: str) -> int:
    """The workers the form shows first: ``backend``'s default, else a local cluster's (its only size rule here)."""
    for name in (backend, "local"):
        try:
            workers = backends.get_backend(name).default_workers()
        except ClusterError:  # a backend that does not load here
            continue
        if workers is not None:
            return int(workers)
    return 1


class Launcher(static_render.StaticOutput, w.VBox):
    """Start, scale and stop a cluster from a notebook.

    Attributes
    ----------
    handle : ClusterHandle or None
        The cluster this launcher started (None before Start / after Stop).
    """

    def __init__(self, **kwargs: Any) -> None:
        self.handle: Any = None
        names = sorted(backends.available())
        # wide enough for the longest label ("memory limit"), the same for all so the fields line up
        label = {"description_width": "100px"}
        default = config.get("backend") or "local"
        self.backend = w.Dropdown(
            options=names, value=default if default in names else names[0], description="backend", style=label
        )
        self.name = w.Text(value="", placeholder="automatic", description="name", style=label)
        self.workers = w.BoundedIntText(
            value=_default_workers(self.backend.value), min=0, max=100_000, description="workers", style=label
        )
        self.threads = w.BoundedIntText(
            value=int(config.get("local.threads") or 1), min=1, max=1024, description="threads", style=label
        )
        self.memory_limit = w.Text(
            value=str(config.get("local.memory-limit") or "auto"), description="memory limit", style=label
        )
        self.start_button = w.Button(description="Start", button_style="primary", icon="play")
        self.scale_button = w.Button(description="Scale", icon="arrows-v", disabled=True)
        self.stop_button = w.Button(description="Stop", button_style="danger", icon="stop", disabled=True)
        self.status = w.HTML("No cluster started from here yet.")
        self.view = w.VBox([])
        self.start_button.on_click(lambda _: self.start())
        self.scale_button.on_click(lambda _: self.scale())
        self.stop_button.on_click(lambda _: self.stop())
        form = w.VBox([self.backend, self.name, self.workers, self.threads, self.memory_limit])
        buttons = w.HBox([self.start_button, self.scale_button, self.stop_button])
        super().__init__([form, buttons, self.status, self.view], **kwargs)

    def static_bundle(self) -> dict[str, str]:
        """The status line and, once a cluster was started here, its table (as last shown)."""
        import re

        status = html.unescape(re.sub(r"<[^>]+>", "", self.status.value))
        views = [c for c in self.view.children if isinstance(c, ClusterWidget)]
        parts = [c.static_bundle() for c in views]
        return {
            "text/plain": "\n".join([f"launcher: {status}"] + [p["text/plain"] for p in parts]),
            "text/html": "<div class='jupyter-cluster-static'>"
            f"<div>{self.status.value}</div>{''.join(p['text/html'] for p in parts)}</div>",
        }

    def static_version(self) -> Any:
        views = [c.static_version() for c in self.view.children if isinstance(c, ClusterWidget)]
        return (self.status.value, tuple(views))

    def _say(self, text: str, error: bool = False) -> None:
        colour = "#d9534f" if error else "inherit"
        self.status.value = f"<span style='color:{colour}'>{html.escape(text)}</span>"

    def _options(self) -> dict[str, Any]:
        impl = backends.get_backend(self.backend.value)
        wanted = {
            "workers": self.workers.value,
            "threads": self.threads.value,
            "memory_limit": self.memory_limit.value.strip() or None,
        }
        return {k: v for k, v in wanted.items() if k in impl.options and v is not None}

    def start(self) -> Any:
        """Start a cluster with the form's settings; it becomes the current cluster."""
        if self.handle is not None and not self.handle.closed:
            self._say(f"{self.handle.name!r} is already running; stop it first or use Scale.", error=True)
            return self.handle
        self.start_button.disabled = True
        self._say("starting ...")
        try:
            handle = session.start(name=self.name.value.strip() or None, backend=self.backend.value, **self._options())
        except ClusterError as exc:
            self._say(str(exc), error=True)
            self.start_button.disabled = False
            return None
        except Exception:
            self.start_button.disabled = False
            raise
        self.handle = handle
        self.scale_button.disabled = not handle.owns_cluster
        self.stop_button.disabled = False
        self._say(f"Started {handle.name!r} ({handle.backend}) at {handle.address}; it is the current cluster.")
        self.view.children = [ClusterWidget(handle)]
        return handle

    def scale(self) -> None:
        """Scale the started cluster to the form's worker count."""
        if self.handle is None or self.handle.closed:
            self._say("start a cluster first.", error=True)
            return
        try:
            self.handle.scale(self.workers.value)
        except ClusterError as exc:
            self._say(str(exc), error=True)
            return
        self._say(f"Scaling {self.handle.name!r} to {self.workers.value} workers.")

    def stop(self) -> None:
        """Stop the started cluster."""
        if self.handle is None or self.handle.closed:
            self._say("no cluster to stop.", error=True)
            return
        name = self.handle.name
        try:
            self.handle.close()
        except ClusterError as exc:
            self._say(str(exc), error=True)
            return
        for child in self.view.children:
            if isinstance(child, ClusterWidget):
                child.refresh(None)
        self.start_button.disabled = False
        self.scale_button.disabled = True
        self.stop_button.disabled = True
        self._say(f"Stopped {name!r}.")
