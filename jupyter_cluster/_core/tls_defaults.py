"""Tornado's default client TLS context, made in a thread while the rest of the package is imported.

Tornado makes that context (the system's CA store: about 0.06 s of CPU on
a 2-core machine) the first time a process accepts or opens a TLS
connection, though a stream that was given a context of its own never uses
it.  A script's first ``Pool`` result waited for it: the local cluster's
scheduler runs in the script and its fork server (``backends.local.preload``)
makes it once for every worker it forks.  OpenSSL reads the store with the
GIL released, so :func:`begin`, called as the package is imported, makes it
in a thread while the main thread imports distributed, and :func:`install`
hands it to tornado.

Linux only, as the preload's own: on macOS loading the store may start
threads, which a fork would not carry.  A fork waits for the thread
(``os.register_at_fork``), so no child inherits OpenSSL half-way through.
"""

from __future__ import annotations

import os
import ssl
import sys
import threading
from typing import Any

_made: ssl.SSLContext | None = None
_thread: threading.Thread | None = None


def begin() -> None:
    """Start making the context in a daemon thread (once per process, on Linux)."""
    global _thread
    if _thread is not None or not sys.platform.startswith("linux"):
        return

    def make() -> None:
        global _made
        try:
            context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
            context.options |= getattr(ssl, "OP_NO_COMPRESSION", 0)  # as tornado's own
        except Exception:  # noqa: BLE001 - tornado then makes its own, as without this module
            return
        _made = context

    _thread = threading.Thread(target=make, name="jupyter-cluster-tls-defaults", daemon=True)
    _thread.start()
    os.register_at_fork(before=_finish)


def _finish() -> None:
    if _thread is not None and _thread is not threading.current_thread():
        _thread.join()


def install() -> None:
    """Give tornado the context made by :func:`begin` (waiting for it), else let tornado make its own now."""
    import tornado.netutil as netutil

    own: Any = getattr(netutil, "_client_ssl_defaults", None)
    if own is None:
        return  # a tornado without it: each stream makes what it needs, as before
    _finish()
    made = _made
    if made is None or not hasattr(own, "cache_info") or own.cache_info().currsize:
        own()  # nothing made here, or tornado has its own already: that one stays
        return

    def client_ssl_defaults() -> ssl.SSLContext:
        return made

    # tornado's iostream (and simple_httpclient) import the function by name when they are imported
    for module in (netutil, sys.modules.get("tornado.iostream"), sys.modules.get("tornado.simple_httpclient")):
        if module is not None and getattr(module, "_client_ssl_defaults", None) is own:
            setattr(module, "_client_ssl_defaults", client_ssl_defaults)  # noqa: B010 - a private name of theirs
