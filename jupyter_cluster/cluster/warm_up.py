"""A new local cluster's engine warm-up, in the background, unless a call is waiting for the cluster now.

The warm-up (:func:`..engine.cluster.warm_engine`: a no-op task pinned to each
worker, direct connections opened to each) readies the cluster for its first
map while the user writes the next cell.  A cluster started by a call that
needs it at once (the default cluster a script's ``Pool()``, ``jc.map`` or a
``Queue`` starts) has no such pause ahead: the warm-up ran beside that call's
first task and took what it needed (its no-op tasks queued before the call's
first task on one-thread workers, its TLS handshakes shared both cores), and
that call's own work warms the cluster anyway.  Measured on 2 shared cores
(``benchmarks/mp_dropin.py``, issue 36): see ``benchmarks/LOG.md``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from ..engine.cluster import warm_engine

_state = threading.local()


@contextlib.contextmanager
def for_a_waiting_call() -> Iterator[None]:
    """Starts made in this block (this thread) are for a call that waits for the cluster: no warm-up."""
    before = getattr(_state, "waiting", False)
    _state.waiting = True
    try:
        yield
    finally:
        _state.waiting = before


def begin(client: Any, expected: int | None) -> threading.Thread | None:
    """Begin the warm-up of ``client``'s new cluster in a daemon thread (None: a call waits for it, see above)."""
    if getattr(_state, "waiting", False):
        return None
    thread = threading.Thread(target=_warm_engine, args=(client, expected), daemon=True, name="jupyter-cluster-warm")
    thread.start()
    return thread


def _warm_engine(client: Any, expected: int | None = None) -> None:
    try:
        warm_engine(client, expected)  # measured: see benchmarks/LOG.md, first_item.py, session 6
    except Exception as exc:  # noqa: BLE001 - a cluster stopped at once, say; the first map asks again and reports
        client._jc_warm_error = f"{type(exc).__name__}: {exc}"  # kept for diagnostics only
