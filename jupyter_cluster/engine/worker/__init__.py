"""What runs on a worker: the direct path's comm handlers and leases, and the items of every map.

- :mod:`.handlers`: the comm handlers (:class:`~..protocol.Op`) and
  :class:`~.handlers.EnginePlugin`, which registers them on every worker;
  relays forward a group's batches.
- :mod:`.registry`: the leases running in this process; idle ones give their
  threads to waiting tasks at once.
- :mod:`.lease`: the lease task, running batches from its mailbox.
- :mod:`.run`: :func:`~.run.run_chunk`, the worker half of every map (both
  paths): function cache, :class:`~.run.PreparedCell`, output capture,
  retries, timeouts, errors as data.
- :mod:`.groups`: ``Pool``'s stop groups (``terminate()`` frees threads at once).

Only the standard library, cloudpickle, msgpack, distributed and the cell
function are imported here (no notebook side): this package is loaded into
every worker process.  The names below are what the rest of the package uses.
"""

from .groups import GroupStopped, run_in_group, stop_group
from .handlers import EnginePlugin
from .lease import lease, warm_up
from .run import PreparedCell, error_info, install_thread_streams, run_chunk, run_items, worker_namespace

__all__ = [
    "EnginePlugin",
    "GroupStopped",
    "PreparedCell",
    "error_info",
    "install_thread_streams",
    "lease",
    "run_chunk",
    "run_in_group",
    "run_items",
    "stop_group",
    "warm_up",
    "worker_namespace",
]
