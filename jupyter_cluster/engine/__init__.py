"""The map engine, one module per job (read one path at a time).

- :mod:`.job`: :class:`~.job.MapJob`, one map (input window, ordering,
  retries, errors, observers, interrupt); no Dask, no path.
- :mod:`.planner`: chunk sizes (pure functions).
- :mod:`.dispatch`: the :class:`~.dispatch.Dispatcher` protocol a map sends
  its chunks through, and the :class:`~.dispatch.Event`\\ s it hears back.
- :mod:`.paths`: which path a map takes (builds its dispatcher).
- :mod:`.direct`: the direct path (leases, the lease pool, relays).
- :mod:`.tasks`: the task path (one Dask task per chunk).
- :mod:`.faults`: suspects, poison, allowed deaths.
- :mod:`.cluster`: the client, its scheduler and workers (worker lists,
  threads, reachability, warm-up, the scheduler watch, error translation).
- :mod:`.protocol`: the wire format, used by both sides.
- :mod:`.worker`: what runs on a worker (handlers, leases, running items).
"""
