"""Where this code runs: in a Jupyter kernel or not, with ipywidgets or not.

A leaf module (the standard library only), so that every layer can ask
without importing the notebook side.
"""

from __future__ import annotations

import sys


def in_kernel() -> bool:
    """Whether this code runs in a Jupyter kernel (not a terminal IPython or a script)."""
    # A kernel has always imported IPython; a plain script has not, and
    # importing it here (0.1 s) stalled the first map that showed progress.
    if "IPython" not in sys.modules:
        return False
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    ip = get_ipython()
    return ip is not None and getattr(ip, "kernel", None) is not None


def in_worker_process() -> bool:
    """Whether this process is a Dask worker (started by a nanny, or by ``dask worker --no-nanny``).

    Or the fork server local workers are forked from (``backends.local``), which
    preloads their modules.
    """
    import multiprocessing

    if multiprocessing.current_process().name == "Dask Worker process (from Nanny)":
        return True
    if any("from multiprocessing.forkserver import main" in arg for arg in getattr(sys, "orig_argv", ())):
        return True
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) == "distributed.cli.dask_worker"


def widgets_available() -> bool:
    """Whether ipywidgets can be imported."""
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True
