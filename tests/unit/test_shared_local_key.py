"""Local clusters share this user's key (made once a week, not once a start), kept as private as a cluster's own."""

from __future__ import annotations

import os
import stat
import time

import pytest

from jupyter_cluster.state import credentials


@pytest.fixture
def registry(tmp_path, monkeypatch):
    folder = tmp_path / "registry"
    folder.mkdir(mode=0o700)
    monkeypatch.setattr(credentials.registry, "registry_dir", lambda: str(folder))
    return folder


def _pem(name: str) -> str:
    with open(credentials.pem_path(name)) as f:
        return f.read()


def test_local_clusters_reuse_one_private_key_and_others_get_their_own(registry):
    credentials.new_security("a", reuse=True)
    credentials.new_security("b", reuse=True)
    shared = registry / credentials.USER_PEM
    assert _pem("a") == _pem("b") == shared.read_text()
    for path in (shared, registry / "a.pem", registry / "a.tls"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert credentials.names_with_credentials() == {"a", "b"}  # the shared file names no cluster
    credentials.new_security("c")  # SSH hosts, batch jobs: the key leaves this machine
    assert _pem("c") != _pem("a")
    assert "BEGIN CERTIFICATE" in _pem("c") and "PRIVATE KEY" in _pem("c")


@pytest.mark.parametrize("flaw", ["group_readable", "old", "damaged", "symlink"])
def test_a_shared_key_that_is_not_exactly_private_and_fresh_is_replaced(registry, tmp_path, flaw):
    credentials.new_security("a", reuse=True)
    shared = registry / credentials.USER_PEM
    before = shared.read_text()
    if flaw == "group_readable":
        shared.chmod(0o640)
    elif flaw == "old":
        past = time.time() - credentials.USER_PEM_MAX_AGE - 60
        os.utime(shared, (past, past))
    elif flaw == "damaged":
        shared.write_text("not a key")
    else:
        elsewhere = tmp_path / "planted.pem"
        elsewhere.write_text(before)
        elsewhere.chmod(0o600)
        shared.unlink()
        shared.symlink_to(elsewhere)
    credentials.new_security("b", reuse=True)
    assert _pem("b") != before
    assert not shared.is_symlink() and stat.S_IMODE(shared.stat().st_mode) == 0o600
    assert shared.read_text() == _pem("b")
