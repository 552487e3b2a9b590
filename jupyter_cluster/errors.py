"""The exceptions jupyter_cluster raises on purpose.

Each carries one sentence that says what is wrong and what to do; the magics
print that sentence without a traceback.
"""


class ClusterError(RuntimeError):
    """A cluster could not be started, found, reached or changed."""


class CellError(ValueError):
    """A ``%%parallel`` cell or its header cannot be run as written."""


class SerializationError(TypeError):
    """A value the work needs cannot be sent to the workers."""


class WorkerLostError(ClusterError):
    """An item kept killing the workers that ran it (a "poison pill")."""
