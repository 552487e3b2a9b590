"""This process's clusters: ``session`` starts, connects, holds and stops them; ``control`` asks another owner to stop.

``client`` connects a session's ``distributed.Client`` (and lets go of a lost scheduler),
``final_word`` is what a stopping owner leaves the Jupyter server, ``display`` renders a
cluster as HTML and text, ``versions`` compares package versions across the cluster.  What every process reads about clusters (the
registry, credentials) is the lower package :mod:`jupyter_cluster.state`.
"""
