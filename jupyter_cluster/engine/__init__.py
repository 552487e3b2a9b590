"""The map engine's parts: what runs on workers (:mod:`.worker`) and the client's direct path (:mod:`.dask`)."""
