"""The map engine, one module per job (read one path at a time).

- :mod:`.job`: :class:`~.job.MapJob`, one map's loop (ordering, retries,
  errors, faults, interrupt); no Dask, no path.  Its parts: :mod:`.record`
  (what the magic, ``Pool`` and observers read), :mod:`.window` (the input
  read ahead and the items sent back), :mod:`.observers` (progress, ``last_job``).
- :mod:`.port`: the cluster as a map sees it (:class:`~.port.ClusterPort`:
  its dispatchers, scattered values, scheduler watch, workers); faked in
  ``tests/unit/test_job_loop.py``.
- :mod:`.planner`: chunk sizes (pure functions).
- :mod:`.dispatch`: the :class:`~.dispatch.Dispatcher` protocol a map sends
  its chunks through, and the typed :class:`~.dispatch.MapEvent`\\ s it hears back.
- :mod:`.paths`: which path a map takes (builds its dispatcher).
- :mod:`.direct`: the direct path's dispatcher; :mod:`.leases` a map's leases
  and batches in flight (relays too), :mod:`.lease_pool` a client's idle leases.
- :mod:`.tasks`: the task path (one Dask task per chunk).
- :mod:`.faults`: suspects, poison, allowed deaths.
- :mod:`.paused`: a map waiting on workers that cannot run it (none, or all paused).
- :mod:`.cluster`: the client, its scheduler and workers (worker lists,
  threads, reachability, warm-up, the scheduler watch, error translation).
- :mod:`.protocol`: the wire format, used by both sides.
- :mod:`.worker`: what runs on a worker (handlers, leases, running items).
"""
