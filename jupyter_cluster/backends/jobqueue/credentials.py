"""The files a batch cluster's jobs read: a 0700 folder of this user's, and the TLS credentials copied into it.

The folder is ``jupyter-cluster.jobqueue.shared-directory`` (in the home directory by
default, which batch nodes share); each cluster's certificate goes there in a 0600 file.
"""

from __future__ import annotations

import os
import stat
from typing import Any

from ... import config
from ...errors import ClusterError


def shared_directory() -> str:
    """The folder the jobs read credentials from and write logs to: 0700, this user's.

    ``jupyter-cluster.jobqueue.shared-directory``; by default in the home
    directory, which batch nodes mount.
    """
    path = os.path.expanduser(os.path.expandvars(config.get("jobqueue.shared-directory") or "~/.jupyter-cluster/jobs"))
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if not os.path.isdir(path) or st.st_uid != os.getuid():
        raise ClusterError(
            f"{path} is not a folder of this user; set jupyter-cluster.jobqueue.shared-directory to a private folder the batch nodes see."
        )
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, 0o700)
    return path


def _job_security(security: Any, pem: str) -> Any:
    """``security`` with every key and certificate read from ``pem`` (the copy the jobs see)."""
    from distributed.security import Security

    fields = {k: getattr(security, k) for k in ("require_encryption",)}
    fields["tls_ca_file"] = pem
    for role in ("client", "scheduler", "worker"):
        fields[f"tls_{role}_cert"] = pem
        fields[f"tls_{role}_key"] = pem
    return Security(**fields)


def _copy_private(src: str, dst: str) -> None:
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f, open(src) as s:
        f.write(s.read())
    os.chmod(dst, 0o600)
