"""A map's options and small helpers of its record: checked before any work is sent (:func:`check_options`)."""

from __future__ import annotations

import math
import sys
import threading
from typing import Any

from ..errors import ClusterError
from .protocol import RemoteItemError

#: Longest --timeout accepted, in seconds (Python's own limit on a thread wait, about 292 years at most).
MAX_TIMEOUT_SECONDS = float(min(threading.TIMEOUT_MAX, 10**9))


def check_options(
    *,
    errors: str = "raise",
    chunksize: Any = "auto",
    retries: int = 0,
    timeout: Any = None,
    resources: dict | None = None,
    concurrency: Any = None,
) -> float | None:
    """Check a map's options (every front end passes through here); returns the timeout to use.

    Raises ``ValueError``/``TypeError`` with one sentence naming the option
    and the fix.  ``timeout=inf`` means no limit.
    """
    if errors not in ("raise", "collect"):
        raise ValueError(f"errors must be 'raise' or 'collect', not {errors!r}.")
    if chunksize != "auto":
        if isinstance(chunksize, bool) or not isinstance(chunksize, int) or chunksize < 1:
            raise ValueError(f"chunksize must be a positive integer or 'auto', not {chunksize!r}.")
        if chunksize > sys.maxsize:
            raise ValueError(
                f"chunksize {chunksize} is larger than any input can be read at once; use at most {sys.maxsize} (or 'auto')."
            )
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries must be a whole number, 0 or more, not {retries!r}.")
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise TypeError(f"timeout must be a number of seconds, not {type(timeout).__name__}.")
        if math.isnan(timeout) or timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}.")
        if math.isinf(timeout):
            timeout = None  # no limit, which is what "infinite" asks for
        elif timeout > MAX_TIMEOUT_SECONDS:
            raise ValueError(
                f"timeout {timeout:g} s is longer than the {MAX_TIMEOUT_SECONDS:g} s an item can be waited for; "
                "use a smaller number, or inf (or no timeout) for no limit."
            )
    if resources:
        for name, amount in resources.items():
            if (
                isinstance(amount, bool)
                or not isinstance(amount, (int, float))
                or not math.isfinite(amount)
                or amount <= 0
            ):
                shown = (
                    f"{amount:g}" if isinstance(amount, (int, float)) and not isinstance(amount, bool) else repr(amount)
                )
                raise ValueError(
                    f"resources {name}={shown} is not a positive amount, so no worker could ever run the map; "
                    f"ask for a positive amount such as {name}=1, or drop it."
                )
    if concurrency is not None and (
        isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1
    ):
        raise ValueError(f"concurrency must be a positive integer or None, not {concurrency!r}.")
    return timeout


def check_resources(workers: dict[str, dict], resources: dict) -> None:
    """Raise :class:`~jupyter_cluster.errors.ClusterError` when no worker of ``workers`` has ``resources``."""
    if not any(all(w.get("resources", {}).get(k, 0) >= v for k, v in resources.items()) for w in workers.values()):
        wanted = ",".join(f"{k}={v}" for k, v in resources.items())
        raise ClusterError(
            f"no worker of this cluster has the resources {wanted}; start workers that have them "
            f"(e.g. `dask worker ADDRESS --resources {wanted}`) or drop --resources."
        )


def _text_of(exc: BaseException) -> BaseException:
    """A stand-in for ``exc`` that keeps only its text (what a finished map's record shows)."""
    msg = str(exc).strip()
    if isinstance(exc, RemoteItemError):  # already text: "TypeName: message"
        stand_in = RemoteItemError(msg)
    else:
        stand_in = RemoteItemError(f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__)
    for note in getattr(exc, "__notes__", None) or ():
        _add_note(stand_in, str(note))
    return stand_in


def _add_note(exc: BaseException, note: str) -> None:
    if hasattr(exc, "add_note"):
        exc.add_note(note)


def _known_length(iterables: tuple) -> int | None:
    lengths = []
    for it in iterables:
        try:
            lengths.append(len(it))
        except TypeError:
            return None
    return min(lengths) if lengths else None
