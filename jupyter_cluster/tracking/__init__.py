"""Maps and runs as records: ``kernel``, ``tags``, ``context``, ``record``, ``table``, ``kept``, ``runs``, ``progress``.

Where the kernel is, the tag a sweep's items carry, named runs, a map's record and what the kernel
keeps, the runs table, the runs the server kept, the public ``jc.run()``/``jc.runs()``, and a map's
progress model.  Named ``tracking`` so that ``jupyter_cluster.runs`` stays a plain function.
"""
