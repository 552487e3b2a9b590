"""What this user's clusters leave on the machine, read by every process: 0600 files under Jupyter's runtime folder.

``registry`` (one record per cluster, and the final word of a stopped one),
``credentials`` (TLS files), ``dashboard_socket`` (a local dashboard on a Unix
socket), ``orphans`` (the clean-up of a cluster whose owner died) and
``history_files`` (the server's kept history, read by kernels too).  Nothing
here imports a backend, the engine or the notebook side.
"""
