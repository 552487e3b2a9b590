"""Old home of the engine's Dask side, kept only until every importer moved (to be removed on this branch).

Now :mod:`.cluster` (the client, its scheduler and workers), :mod:`.direct`
(leases, the lease pool, relays) and :mod:`.tasks` (the task path).
"""

from .cluster import *  # noqa: F403
from .direct import DEPTH, Lease, LeasePool, Leases, end_leases, pool_for, release_leases  # noqa: F401
