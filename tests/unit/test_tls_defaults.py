"""Tornado's default TLS context, made in a thread from the package's import (``_core/tls_defaults.py``).

Each case runs in a fresh interpreter: what is made is made once per process.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="made ahead on Linux only")


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_the_context_made_at_import_is_the_one_tornado_streams_use():
    out = _run(
        "import jupyter_cluster\n"
        "from jupyter_cluster._core import tls_defaults\n"
        "tls_defaults.install()\n"
        "import tornado.iostream, tornado.netutil\n"
        "made = tls_defaults._made\n"
        "print(made is not None, tornado.iostream._client_ssl_defaults() is made,"
        " tornado.netutil._client_ssl_defaults() is made, len(made.get_ca_certs()) == len("
        "__import__('ssl').create_default_context().get_ca_certs()))\n"
    )
    assert out == "True True True True"  # the system's CA store, as tornado's own would hold


def test_a_context_tornado_made_first_is_kept():
    out = _run(
        "import tornado.netutil, tornado.iostream\n"
        "own = tornado.netutil._client_ssl_defaults()\n"
        "import jupyter_cluster\n"
        "from jupyter_cluster._core import tls_defaults\n"
        "tls_defaults.install()\n"
        "print(tornado.iostream._client_ssl_defaults() is own)\n"
    )
    assert out == "True"


def test_a_fork_right_after_the_thread_began_waits_for_it_and_the_child_uses_tls():
    out = _run(
        "import os, ssl\n"
        "import jupyter_cluster\n"
        "from jupyter_cluster._core import tls_defaults\n"
        "tls_defaults._finish(); tls_defaults._made = tls_defaults._thread = None\n"
        "tls_defaults.begin()  # a fork at once: the store takes tens of ms to read\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    ssl.create_default_context()  # OpenSSL was not inherited half-way through\n"
        "    os._exit(0 if tls_defaults._made is not None else 3)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print(os.waitstatus_to_exitcode(status))\n"
    )
    assert out == "0"
