"""``--idle-timeout`` as people write it, and the configured default."""

from __future__ import annotations

import dask.config
import pytest

from jupyter_cluster.detached.kept import idle_seconds
from jupyter_cluster.errors import ClusterError


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("20s", 20), ("30min", 1800), ("2 mins", 120), ("1h", 3600), (90, 90), ("0", 0), ("1.5 minutes", 90)],
)
def test_durations(text, seconds):
    assert idle_seconds(text) == seconds


def test_the_configured_default_parses():
    assert idle_seconds() == 1800  # the shipped "30min"
    with dask.config.set({"jupyter-cluster.detached.idle-timeout": "5min"}):
        assert idle_seconds() == 300


@pytest.mark.parametrize("bad", ["soon", "-5s", "5 parsecs"])
def test_bad_durations_are_one_sentence(bad):
    with pytest.raises(ClusterError, match="--idle-timeout"):
        idle_seconds(bad)
