"""Every detached test gets its own results store, inherited by the kernels and hosts it starts."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def private_store(tmp_path, monkeypatch):
    import dask.config

    path = str(tmp_path / "jobs")
    monkeypatch.setenv("DASK_JUPYTER_CLUSTER__DETACHED__STORE_DIR", path)
    with dask.config.set({"jupyter-cluster.detached.store-dir": path}):
        yield path
    assert os.stat(path).st_mode & 0o077 == 0 if os.path.exists(path) else True
