"""Work that outlives the kernel: kept clusters and detached maps.

* :mod:`.kept` -- ``%cluster start --keep``: a cluster owned by a host process
  that is not the kernel, attached from any kernel by name;
* :mod:`.host` -- that host process (``python -m jupyter_cluster.detached.host``):
  the cluster, the detached jobs' drivers and the idle shutdown;
* :mod:`.driver` -- one detached job driven through the map engine, each result
  written to the store (:mod:`jupyter_cluster.state.job_store`) as it arrives;
* :mod:`.jobs` -- ``submit``, ``job(NAME)``, ``jobs()``: the kernel's side.
"""
