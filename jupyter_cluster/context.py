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


def widgets_available() -> bool:
    """Whether ipywidgets can be imported."""
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True
