"""A cluster handle stops with ``stop()``, the name ``%cluster stop`` and ``jupyter_cluster.stop`` use.

``close()`` stays as another name for it (Dask's own objects close).
"""

from __future__ import annotations

import pytest

import jupyter_cluster as jc
from jupyter_cluster.errors import ClusterError
from jupyter_cluster.state import registry


def _listed(name: str) -> bool:
    return any(rec.name == name for rec in registry.live_records())


@pytest.mark.parametrize("method", ["stop", "close"])
def test_handle_stops_its_cluster(method):
    handle = jc.start(workers=1, name=f"handle-{method}")
    assert _listed(handle.name)
    assert handle.client.submit(sum, [1, 2]).result(timeout=60) == 3
    getattr(handle, method)()
    assert handle.closed and not _listed(handle.name)
    with pytest.raises(ClusterError, match="already stopped"):
        handle.stop()
    with pytest.raises(ClusterError, match="already stopped"):
        handle.close()
