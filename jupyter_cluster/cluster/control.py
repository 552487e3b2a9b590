"""Remote control of a cluster by whoever owns it, over the cluster's own Dask event topic.

Scaling, adaptivity and stopping need the ``distributed`` cluster object, which
lives only in the process that started the cluster (a kernel, or the host
process the panel spawns).  Rather than open a new port, requests travel on the
scheduler's event log, topic ``jupyter-cluster:control``:

* request ``{"op": "scale"|"adapt"|"stop", "cluster": name, "id": str, ...}``
* reply   ``{"op": "reply", "id": str, "ok": bool, "error": str | None}``

The owner subscribes with :func:`listen`; the Jupyter server (async) and other
kernels (:func:`stop_remote`) send requests.  Anyone who can reach the scheduler
can already shut it down or run code on it, so this grants nothing new.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from ..errors import ClusterError
from ..state import registry
from ..state.credentials import saved_security
from ..telemetry.topic_names import CONTROL_TOPIC
from ..wire.envelopes import CONTROL_OPS, ControlRequest, control_reply, control_request

OPS = CONTROL_OPS  # ("scale", "adapt", "stop"): the ops are typed in wire/envelopes.py

logger = logging.getLogger(__name__)


def make_request(cluster: str, op: str, **args: Any) -> ControlRequest:
    """A request message for ``op`` on ``cluster``."""
    return control_request(cluster, op, uuid.uuid4().hex, **args)


def _apply(handle: Any, msg: dict[str, Any]) -> None:
    """Carry out one request on a handle we own (runs in its own thread)."""
    op = msg["op"]
    if op == "scale":
        handle.scale(int(msg["n"]))
    elif op == "adapt":
        maximum = msg.get("maximum")
        handle.adapt(int(msg.get("minimum") or 0), int(maximum) if maximum is not None else None)
    elif op == "stop":
        handle.close()


def listen(handle: Any, on_stop: Callable[[], None] | None = None) -> None:
    """Answer control requests for ``handle`` (a :class:`~jupyter_cluster.cluster.session.ClusterHandle`).

    Only a handle that owns its cluster can scale or stop it; attached handles
    are left alone so that the owner answers.

    Parameters
    ----------
    handle : ClusterHandle
    on_stop : callable, optional
        Called instead of ``handle.close()`` on a stop request, for an owner
        that must close from its own thread (the panel's host process).
    """
    if not getattr(handle, "owns_cluster", False):
        return
    client = handle.client

    def reply(msg_id: str, error: str | None) -> None:
        try:
            client.log_event(CONTROL_TOPIC, control_reply(msg_id, error))
        except Exception:  # the client closed under us (stop): the requester sees the record vanish
            pass

    def work(msg: dict[str, Any]) -> None:
        error = None
        try:
            if msg["op"] == "stop":
                # Answer first: after close() there is no client to answer with.
                reply(msg["id"], None)
            if msg["op"] == "stop" and on_stop is not None:
                on_stop()
            else:
                _apply(handle, msg)
        except ClusterError as exc:
            error = str(exc)
        except (TypeError, ValueError, KeyError) as exc:
            error = f"bad {msg.get('op')} request: {exc}."
        except Exception as exc:  # pragma: no cover - reported to the requester, not raised here
            logger.exception("control request %r failed", msg)
            error = f"{type(exc).__name__}: {exc}"
        if msg["op"] != "stop" or error:
            reply(msg["id"], error)

    def on_event(event: tuple[float, Any]) -> None:
        msg = event[1]
        if not isinstance(msg, dict) or msg.get("op") not in OPS or msg.get("cluster") != handle.name:
            return
        if handle.closed:
            return
        # Never block the client's event loop: scale/close use the sync API.
        threading.Thread(target=work, args=(msg,), name=f"jupyter-cluster-control-{msg['op']}", daemon=True).start()

    client.subscribe_topic(CONTROL_TOPIC, on_event)


def stop_remote(name: str, timeout: float = 15.0) -> str:
    """Stop a cluster this process does not hold, by asking its owner.

    Used by ``%cluster stop NAME`` for clusters started from the JupyterLab
    panel.  Clusters owned by another kernel are refused: stop them there.

    Returns
    -------
    str
        The name of the stopped cluster.
    """
    from distributed import Client

    record = registry.read(name)
    if record is None:
        known = ", ".join(r.name for r in registry.live_records()) or "none"
        raise ClusterError(f"no cluster named {name!r} is running (known: {known}); see %cluster list.")
    if record.owner_kind == "kernel" or record.attached:
        raise ClusterError(
            f"cluster {name!r} belongs to another kernel (pid {record.owner_pid}); stop it from that kernel or from the JupyterLab cluster panel."
        )
    answered = threading.Event()
    result: dict[str, Any] = {}
    request = make_request(name, "stop")

    def on_event(event: tuple[float, Any]) -> None:
        msg = event[1]
        if isinstance(msg, dict) and msg.get("op") == "reply" and msg.get("id") == request["id"]:
            result.update(msg)
            answered.set()

    try:
        security = saved_security(record.name) if record.address.startswith("tls://") else None
        client = Client(record.address, timeout=5, set_as_default=False, security=security)
    except (OSError, TimeoutError) as exc:
        raise ClusterError(
            f"the scheduler of {name!r} at {record.address} does not answer; is it still running?"
        ) from exc
    try:
        client.subscribe_topic(CONTROL_TOPIC, on_event)
        client.log_event(CONTROL_TOPIC, request)
        if not answered.wait(timeout=5):
            # No owner listens (an old or foreign process): stop the scheduler itself.
            client.shutdown()
        elif not result.get("ok"):
            raise ClusterError(result.get("error") or f"the owner of {name!r} refused to stop it.")
    finally:
        try:
            client.close(timeout=2)
        except Exception:
            pass
    deadline = time.monotonic() + timeout
    while registry.read(name) is not None and time.monotonic() < deadline:
        time.sleep(0.1)  # the owner removes the record once the cluster is down
    return name
