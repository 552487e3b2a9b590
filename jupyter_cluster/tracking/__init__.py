"""Maps and runs as records: ``runs`` (named runs, sweep tags, the runs table), ``progress`` (a map's progress model).

Named ``tracking`` so that ``jupyter_cluster.runs`` stays a plain function.
"""
