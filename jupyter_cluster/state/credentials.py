"""TLS credentials of local clusters, kept beside their registry records.

One self-signed EC certificate per cluster, in 0600 files in the registry's
0700 folder (``<name>.pem``: key and certificate; ``<name>.tls``: the
``distributed.Security`` settings that point at it).  The process that starts a
cluster writes them (:func:`new_security`); this user's other processes (kernels,
the Jupyter server, the panel's host) read them (:func:`saved_security`); they
are deleted when the cluster stops (:func:`forget_security`), and by the registry
when it drops a dead owner's record (``registry.SIDECARS``).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import Any

from . import registry


def credentials_path(name: str) -> str:
    """Where the ``Security`` settings of the cluster ``name`` are kept (beside its registry record)."""
    return os.path.join(registry.registry_dir(), f"{name}.tls")


def pem_path(name: str) -> str:
    """Where the key and certificate of the cluster ``name`` are kept."""
    return os.path.join(registry.registry_dir(), f"{name}.pem")


def _write_private(path: str, text: str) -> None:
    """Write ``text`` to ``path`` readable by this user only (0600 from creation on)."""
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")  # mkstemp creates it 0600
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


#: the key and certificate this user's local clusters share (see :func:`new_security`'s ``reuse``);
#: a dot file, so that :func:`names_with_credentials` does not take it for a cluster's
USER_PEM = ".local-clusters.pem"
#: how long the shared key is used before a new one is made (seconds); its certificate is valid for longer
USER_PEM_MAX_AGE = 7 * 24 * 3600


def _generate_pem(common_name: str) -> str:
    """A new EC P-256 key and a self-signed certificate for it, as PEM text (key first)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("dask-internal")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    return (
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode()
        + cert.public_bytes(serialization.Encoding.PEM).decode()
    )


def _private_text(path: str, max_age: float) -> str | None:
    """The text of ``path`` if it is this user's own regular file, mode 0600 or stricter, younger than ``max_age``."""
    import stat
    import time

    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    with os.fdopen(fd) as f:
        st = os.fstat(fd)
        if (
            not stat.S_ISREG(st.st_mode)
            or st.st_uid != os.getuid()
            or st.st_mode & 0o077
            or time.time() - st.st_mtime > max_age
        ):
            return None
        try:
            return f.read()
        except (OSError, UnicodeDecodeError):
            return None


def _user_pem() -> str:
    """The key and certificate this user's local clusters share, made once a week rather than once a cluster.

    Making a key costs little, but importing ``cryptography`` for it took
    0.1-0.2 s of a script's first ``Pool`` result.  The file is as private as
    a cluster's own (0600, this user's, in the 0700 registry folder, which
    holds every cluster's key anyway), so sharing it gives no one access who
    had none: only processes of this user can read either.  A file that is not
    exactly that (another owner, wider mode, a link, too old, damaged) is
    replaced, not used.
    """
    path = os.path.join(registry.registry_dir(), USER_PEM)
    text = _private_text(path, USER_PEM_MAX_AGE)
    if text is not None and "PRIVATE KEY-----" in text and "BEGIN CERTIFICATE-----" in text:
        return text
    text = _generate_pem(f"jupyter-cluster local clusters of uid {os.getuid()}")
    _write_private(path, text)
    return text


def new_security(name: str, reuse: bool = False):
    """Fresh TLS credentials for the cluster ``name``: a self-signed EC P-256 certificate.

    The key and certificate go to ``<registry dir>/<name>.pem`` (mode 0600, in
    a 0700 folder) and every role (scheduler, workers, clients) uses them, so
    only processes of this user can join or connect: Dask's TLS is mutual, a
    peer without a certificate signed by this one is refused during the
    handshake.  An EC key takes well under a millisecond to make, where
    ``Security.temporary()``'s 2048-bit RSA key takes ~50-100 ms; the
    ``Security`` holds file paths, so Dask reads the files rather than writing
    in-memory keys to temporary files for every SSL context it builds.

    With ``reuse`` (local clusters, whose key never leaves this machine), the
    key and certificate are this user's shared ones (:func:`_user_pem`), copied
    to the cluster's file: no ``cryptography`` import and no key generation in
    a start.  Clusters whose key is copied to other machines (SSH hosts, batch
    jobs' shared folders) get a key of their own.
    """
    from distributed.security import Security

    pem = _user_pem() if reuse else _generate_pem(f"jupyter-cluster {name}")
    path = pem_path(name)
    _write_private(path, pem)
    fields: dict[str, Any] = {"require_encryption": True, "tls_ca_file": path}
    for role in ("client", "scheduler", "worker"):
        fields[f"tls_{role}_cert"] = path
        fields[f"tls_{role}_key"] = path
    security = Security(**fields)
    save_security(name, security)
    return security


def save_security(name: str, security: Any) -> str:
    """Write ``security``'s settings where :func:`saved_security` finds them (0600)."""
    path = credentials_path(name)
    fields = {
        k: getattr(security, k)
        for k in security.__slots__
        if k not in ("extra_conn_args", "tls_min_version", "tls_max_version")
    }
    _write_private(path, json.dumps(fields))
    return path


def saved_security(name: str):
    """Credentials of the TLS cluster called ``name`` started on this machine, or None.

    For attaching from another process of the same user (a second kernel, the
    Jupyter server): the files are readable only by that user.
    """
    from distributed.security import Security

    try:
        with open(credentials_path(name)) as f:
            fields = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(fields, dict):
        return None
    try:
        return Security(**fields)
    except (TypeError, ValueError):
        return None


def names_with_credentials() -> set[str]:
    """Names whose credential files exist: TLS clusters started, or being started, by this user.

    A cluster's registry record is written only once it runs, about a second
    after its name was picked and its credentials written; a second process
    starting a cluster meanwhile must not pick the same name (it would
    overwrite the first one's key and certificate, and the first cluster's
    client would fail its TLS handshake).
    """
    try:
        files = os.listdir(registry.registry_dir())
    except OSError:
        return set()
    return {f[: -len(".pem")] for f in files if f.endswith(".pem") and not f.startswith(".")}


def written_identity(name: str) -> tuple[int, int, int] | None:
    """Which key file ``name`` has now (device, inode, modification time), or None if it has none.

    A cluster keeps this to delete only its own credentials later: once it has
    stopped, a later cluster of this process or another may take the same name
    and write new files under it.
    """
    try:
        st = os.stat(pem_path(name))
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns)


def forget_security(name: str, identity: tuple[int, int, int] | None = None) -> None:
    """Delete the credential files of the cluster ``name`` (no error if there are none).

    With ``identity`` (from :func:`written_identity`), only if the key file is
    still that one: a stopped cluster's finaliser, run whenever the garbage
    collector gets to it, must not delete the files of a newer cluster that
    reused the name.
    """
    if identity is not None and written_identity(name) != identity:
        return
    for path in (credentials_path(name), pem_path(name)):
        with contextlib.suppress(OSError):
            os.remove(path)
