"""Objects shared across the cluster: the ``Queue`` (``queue``, kept by the scheduler plugin ``queue_store``) and actors."""
