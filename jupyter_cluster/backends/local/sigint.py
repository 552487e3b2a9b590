"""SIGINT blocked for the processes a local cluster starts (standard library only: the fork server starts early)."""

from __future__ import annotations

import contextlib
import signal


@contextlib.contextmanager
def sigint_blocked_for_children():
    """Block SIGINT in this thread, and so in every thread and process it starts.

    JupyterLab's stop button sends SIGINT to the kernel's whole process group,
    which holds the local worker processes too; they must not die from it.  A
    signal mask is inherited by new threads and kept across ``fork`` and
    ``exec``, so the cluster's event-loop thread (created inside this block)
    starts every worker process - at start, on scale-up, on restart - with
    SIGINT already blocked, before its first Python instruction: there is no
    start-up window.  The kernel's main thread gets its own mask back on exit,
    so the stop button still interrupts the cell (Python raises KeyboardInterrupt
    in the main thread whichever thread takes the signal, even inside the
    block; :meth:`LocalBackend.start` then closes the half-made cluster).
    SIGTERM, which Dask uses to stop workers, is untouched.
    """
    if not hasattr(signal, "pthread_sigmask"):  # Windows: no process-group interrupts there
        yield
        return
    # multiprocessing starts its resource tracker lazily, and *unblocks* SIGINT in
    # the thread that starts it; start it now, outside the block.
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
