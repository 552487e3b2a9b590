"""Cluster discovery: one JSON record per known cluster on this machine.

Every cluster that a kernel, a script or the Jupyter server starts or attaches
to is written to ``<jupyter runtime dir>/jupyter-cluster/<name>.json``.  A record
names its owner process (pid and start time, so a recycled pid is not mistaken
for the owner); records whose owner is gone are reported as dead and removed by
:func:`live_records`, which runs the clean-up hook of the record's backend
(:mod:`jupyter_cluster.state.orphans`: the registry imports no backend).  The sidebar panel and ``%cluster list`` read it.

A process that attaches to a registered cluster by name writes no record (the
cluster has one, its owner's) but an :class:`Attachment` beside it,
``<name>@<pid>.attached``: which kernel uses which cluster, so that the panel
follows that kernel's notebook there (:func:`live_attachments`).
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import tempfile
import time
from collections.abc import Container, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import psutil

from .. import config
from ..errors import ClusterError
from ..wire.models import KERNEL_ID_RE, NAME_RE, kernel_id_or_none
from . import orphans
from .dashboard_socket import socket_is_ours
from .history_files import mtime, read_json

#: files kept beside a record, removed with it (credentials, see backends.local)
SIDECARS = (".tls", ".pem")


def valid_name(name: object) -> bool:
    """Whether ``name`` can name a cluster (and so a file in the registry folder)."""
    return isinstance(name, str) and NAME_RE.fullmatch(name) is not None


def _identify_owner(entry: Any) -> None:
    """Fill in a registry entry's owner start time and, when written by this process, its kernel id."""
    if not entry.owner_started:
        entry.owner_started = _process_start_time(entry.owner_pid)
    if entry.kernel_id is None and entry.owner_pid == os.getpid():
        # found here rather than passed by each writer, so every entry a kernel writes carries it
        entry.kernel_id = current_kernel_id()


def _owner_alive(entry: Any) -> bool:
    """Whether the process that wrote a registry entry still runs (the same pid and start time)."""
    return _process_alive(entry.owner_pid, entry.owner_started)


def _process_alive(pid: int, started: float) -> bool:
    """Whether process ``pid`` is the one that started at ``started`` and still runs (a reused pid is not)."""
    return _process_start_time(pid) == started != 0.0


@dataclass
class ClusterRecord:
    """What the registry knows about one cluster."""

    name: str
    backend: str
    address: str
    dashboard_link: str | None = None
    owner_pid: int = field(default_factory=os.getpid)
    owner_started: float = 0.0
    owner_kind: str = "kernel"  # "kernel", "panel" (Jupyter server) or "process"
    started: float = field(default_factory=time.time)
    attached: bool = False  # True when the owner only connected to it
    extra: dict[str, Any] = field(default_factory=dict)
    #: the Jupyter kernel that wrote the record (its id, as the browser's session names it), or None
    #: for another process; the panel follows the active notebook's cluster with it
    kernel_id: str | None = None

    def __post_init__(self) -> None:
        _identify_owner(self)

    def owner_alive(self) -> bool:
        """Whether the process that wrote this record still runs."""
        return _owner_alive(self)

    def owner_is_panel_host(self) -> bool:
        """Whether the owner is provably the panel's host process for this cluster, run by this user.

        Checked before the Jupyter server signals an owner: a record alone
        (which could be stale or planted) never decides which process is killed.
        """
        if not self.owner_alive():
            return False
        try:
            process = psutil.Process(self.owner_pid)
            cmdline = process.cmdline()
            uid = process.uids().real
        except (psutil.Error, OSError):
            return False
        if uid != os.getuid() or "jupyter_cluster.server.host" not in cmdline:
            return False
        return (
            "--name" in cmdline
            and cmdline.index("--name") + 1 < len(cmdline)
            and cmdline[cmdline.index("--name") + 1] == self.name
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_KERNEL_FILE = re.compile(rf"kernel-(?P<id>{KERNEL_ID_RE.pattern})\.json")


def current_kernel_id() -> str | None:
    """The id of the Jupyter kernel this process is, or None outside a kernel.

    A kernel started by a Jupyter server reads its connection file
    ``kernel-<id>.json``; the id is the one the browser's session reports
    (``session.kernel.id``).  A script, the panel's host process or a kernel
    started from some other connection file name has none.
    """
    if "ipykernel.kernelapp" not in sys.modules:  # not imported: not a kernel (and no import cost)
        return None
    try:
        from ipykernel.connect import get_connection_file
        from ipykernel.kernelapp import IPKernelApp

        if not IPKernelApp.initialized():
            return None
        path = get_connection_file()
    except Exception:  # an ipykernel without these names, or an app half set up: no id rather than no record
        return None
    match = _KERNEL_FILE.fullmatch(os.path.basename(str(path)))
    return match.group("id") if match else None


def _process_start_time(pid: int) -> float:
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:  # killed, not yet reaped by its parent
            return 0.0
        return round(process.create_time(), 2)
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return 0.0


def registry_dir() -> str:
    """The folder that holds the records: created 0700 on demand, tightened to 0700, ours only.

    Raises
    ------
    ClusterError
        When the folder is not a directory of this user (someone else made it,
        or it is a link): records and credentials there could be planted or read.
    """
    path = config.get("registry-dir")
    if not path:
        from jupyter_core.paths import jupyter_runtime_dir

        path = os.path.join(jupyter_runtime_dir(), "jupyter-cluster")
    return private_folder(
        path, "the cluster registry folder", "remove it or set jupyter-cluster.registry-dir to a private folder"
    )


def private_folder(path: str, what: str = "the folder", fix: str = "remove it") -> str:
    """``path``, a folder of this user that no one else may use: created 0700 on demand, tightened to 0700.

    Parameters
    ----------
    path : str
    what : str
        What the folder is, for the error (``"the cluster registry folder"``).
    fix : str
        What the user can do about it, for the error.

    Raises
    ------
    ClusterError
        When it is not a directory of this user (someone else made it, or it
        is a link): files there could be planted or read; also when it lies
        in a folder this user may not enter.
    """
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except PermissionError:  # inside another user's private folder: one sentence, not a traceback
        raise ClusterError(f"{what} {path} is not a folder of this user (permission denied); {fix}.") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise ClusterError(f"{what} {path} is not a folder of this user; {fix}.")
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, 0o700)  # made by an older version or by hand: others must not list, plant or read files
    return path


def _record_path(name: str) -> str:
    if not valid_name(name):
        raise ClusterError(f"{name!r} is not a valid cluster name; use letters, digits, '-', '_' or '.' (at most 63).")
    return os.path.join(registry_dir(), f"{name}.json")


def write(record: ClusterRecord) -> None:
    """Write (or replace) the record of ``record.name`` atomically."""
    directory = registry_dir()
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(record.to_dict(), f)
    os.replace(tmp, _record_path(record.name))


def remove(name: str) -> None:
    """Forget the record of ``name`` and the files kept beside it (no error if there are none)."""
    path = _record_path(name)
    for p in (path, *(path[: -len(".json")] + suffix for suffix in SIDECARS)):
        try:
            os.remove(p)
        except FileNotFoundError:
            pass


def _remove_dashboard_socket(path: object) -> None:
    """Delete a dead cluster's dashboard socket and its private folder, if they are provably ours."""
    if isinstance(path, str) and socket_is_ours(path):
        try:
            os.remove(path)
            os.rmdir(os.path.dirname(path))
        except OSError:
            pass


def read(name: str) -> ClusterRecord | None:
    """The live record called ``name``, or None."""
    for record in live_records():
        if record.name == name:
            return record
    return None


def _own_json_files(suffix: str) -> Iterator[tuple[str, str, dict]]:
    """``(entry, path, data)`` for each registry file ending in ``suffix`` that this user owns and that holds a JSON object.

    Links and other users' files are never trusted; half-written files are skipped.
    """
    directory = registry_dir()
    for entry in sorted(os.listdir(directory)):
        if not entry.endswith(suffix) or entry.startswith("."):
            continue
        path = os.path.join(directory, entry)
        try:
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
                continue
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            yield entry, path, data


def live_records(cleanup: bool = True) -> list[ClusterRecord]:
    """Records whose owner process still runs, oldest first.

    Parameters
    ----------
    cleanup : bool
        Delete the files of records whose owner has died.
    """
    records = []
    for entry, _, data in _own_json_files(".json"):
        try:
            record = ClusterRecord(**data)
        except TypeError:
            continue  # a foreign file: not ours to judge
        if record.name != entry[: -len(".json")] or not valid_name(record.name) or type(record.owner_pid) is not int:
            continue  # a record must be named after its own file (no "../victim")
        # only ever compared, but a record is not trusted to hold anything else
        record.kernel_id = kernel_id_or_none(record.kernel_id)
        if record.owner_alive():
            records.append(record)
        elif cleanup:
            remove(record.name)
            orphans.clean_up(record)  # its backend's hook: cancel batch jobs, stop a gateway cluster
            _remove_dashboard_socket(
                (record.extra or {}).get("dashboard_socket") if isinstance(record.extra, dict) else None
            )
    records.sort(key=lambda r: r.started)
    return records


# -- reservations: a name taken from the moment a process picks it -----------------------------
RESERVED = ".reserved"


def _reservation_path(name: str) -> str:
    return _record_path(name)[: -len(".json")] + RESERVED


def _reservation_owner_alive(path: str) -> bool:
    """Whether the process that wrote the reservation at ``path`` still runs (a half-written one counts as alive)."""
    try:
        st = os.lstat(path)
        with open(path) as f:
            data = json.load(f)
        pid, started = int(data["pid"]), float(data["started"])
    except FileNotFoundError:
        return False
    except (OSError, ValueError, KeyError, TypeError):
        # being written this instant (created empty, then filled), or not ours: never taken over
        # unless it is older than any start's first write
        try:
            return time.time() - os.lstat(path).st_mtime < 10
        except OSError:
            return False
    if st.st_uid != os.getuid():
        return True  # another user's file: not ours to judge, the name stays taken
    return _process_alive(pid, started)


def _holder(path: str) -> str:
    """`` (pid N)`` for the process that wrote the reservation at ``path``, so a user can find it; else ``""``."""
    try:
        with open(path) as f:
            return f" (pid {int(json.load(f)['pid'])})"
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def reserve(name: str) -> None:
    """Take the name ``name`` for a cluster this process is about to start, or refuse it.

    The check and the claim are one step: ``<name>.reserved`` is created with
    ``O_CREAT | O_EXCL``, so of two processes (or threads) starting a cluster of
    the same name at the same moment exactly one gets it.  The reservation
    names its process; one left by a process that died is taken over.  It is
    kept until the cluster's record is written (or the start failed), then
    :func:`release` removes it.

    Raises
    ------
    ClusterError
        When a live cluster has that name or another process is starting one.
    """
    path = _reservation_path(name)
    for _ in range(3):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        except FileExistsError:
            if _reservation_owner_alive(path):
                raise ClusterError(
                    f"a cluster named {name!r} is being started by another process{_holder(path)}; choose another "
                    f"--name or attach with %cluster connect {name} once it runs."
                ) from None
            try:
                os.remove(path)  # its process died before it released the name
            except FileNotFoundError:
                pass
            continue
        with os.fdopen(fd, "w") as f:
            json.dump({"pid": os.getpid(), "started": _process_start_time(os.getpid())}, f)
        # A process that reserved the name before us may have written its record and released it since.
        if read(name) is not None:
            release(name)
            raise ClusterError(
                f"a cluster named {name!r} already exists; choose another --name or attach with %cluster connect {name}."
            )
        return
    raise ClusterError(f"the name {name!r} could not be reserved in {registry_dir()}; choose another --name.")


def release(name: str) -> None:
    """Give back the reservation of ``name`` made by this process (:func:`reserve`); none left is no error."""
    path = _reservation_path(name)
    try:
        with open(path) as f:
            pid = json.load(f).get("pid")
    except (OSError, ValueError, AttributeError):
        return
    if pid == os.getpid():
        try:
            os.remove(path)
        except FileNotFoundError:
            pass


def reserved_names() -> set[str]:
    """Names that a live process has reserved for a cluster it is starting."""
    try:
        entries = os.listdir(registry_dir())
    except OSError:
        return set()
    names = set()
    for entry in entries:
        if entry.endswith(RESERVED) and not entry.startswith("."):
            name = entry[: -len(RESERVED)]
            if valid_name(name) and _reservation_owner_alive(os.path.join(registry_dir(), entry)):
                names.add(name)
    return names


# -- attachments: a process that uses a registered cluster it did not start ------------------
ATTACHED = ".attached"


@dataclass
class Attachment:
    """A process (a kernel, mostly) attached by name to a registered cluster another process owns.

    Written by :func:`jupyter_cluster.cluster.session.connect` and removed when that
    process detaches or stops the cluster; one whose process has died is
    ignored and removed like a dead owner's record.
    """

    name: str  # the cluster's registry name
    address: str  # its scheduler, as the record had it: a later cluster of the same name is not this one
    owner_pid: int = field(default_factory=os.getpid)
    owner_started: float = 0.0
    started: float = field(default_factory=time.time)
    #: the Jupyter kernel that attached (see :func:`current_kernel_id`), or None for another process
    kernel_id: str | None = None

    def __post_init__(self) -> None:
        _identify_owner(self)

    def owner_alive(self) -> bool:
        """Whether the process that attached still runs."""
        return _owner_alive(self)


def _attachment_path(name: str, pid: int) -> str:
    if not valid_name(name):
        raise ClusterError(f"{name!r} is not a valid cluster name; use letters, digits, '-', '_' or '.' (at most 63).")
    return os.path.join(registry_dir(), f"{name}@{pid}{ATTACHED}")


def write_attachment(name: str, address: str) -> Attachment:
    """Say that this process uses the registered cluster ``name`` (at ``address``); returns what was written."""
    attachment = Attachment(name=name, address=address)
    fd, tmp = tempfile.mkstemp(dir=registry_dir(), prefix=".tmp-", suffix=ATTACHED)
    with os.fdopen(fd, "w") as f:
        json.dump(asdict(attachment), f)
    os.replace(tmp, _attachment_path(name, attachment.owner_pid))
    return attachment


def remove_attachment(name: str, pid: int | None = None) -> None:
    """Forget that this process (or ``pid``) uses cluster ``name`` (no error if it did not say so)."""
    try:
        os.remove(_attachment_path(name, os.getpid() if pid is None else pid))
    except FileNotFoundError:
        pass


def live_attachments(cleanup: bool = True) -> list[Attachment]:
    """Attachments whose process still runs, oldest first.

    Parameters
    ----------
    cleanup : bool
        Delete the files of attachments whose process has died.
    """
    found = []
    for entry, path, data in _own_json_files(ATTACHED):
        try:
            attachment = Attachment(**data)
        except TypeError:
            continue  # a foreign file
        if (
            type(attachment.owner_pid) is not int
            or not valid_name(attachment.name)
            or entry != f"{attachment.name}@{attachment.owner_pid}{ATTACHED}"
            or not isinstance(attachment.address, str)
            or not isinstance(attachment.started, (int, float))
        ):
            continue  # named after its own content, or not ours to judge
        attachment.kernel_id = kernel_id_or_none(attachment.kernel_id)
        if attachment.owner_alive():
            found.append(attachment)
        elif cleanup:
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
    found.sort(key=lambda a: a.started)
    return found


# -- final words: what an owner leaves of a cluster it stopped ----------------------------------
#: suffix of a stopped cluster's final word (:func:`write_final`)
FINAL = ".final"
#: final words kept in the folder for a server to take up; beyond them the oldest go
FINAL_KEEP = 64
#: the largest final word a reader takes (a JSON file of jobs; the owner keeps far less)
FINAL_MAX_BYTES = 16_000_000
_FINAL_FILE = re.compile(rf"(?P<name>{NAME_RE.pattern})@[0-9]+-[0-9]+{re.escape(FINAL)}")


def write_final(name: str, data: dict[str, Any]) -> str:
    """Leave what an owner knows of the cluster ``name`` it stops, for the Jupyter server; its path.

    A cluster can start, run its maps and stop before the server has followed
    it (the server scans the registry twice a second and then connects and
    subscribes): the server takes this file up into its history, jobs and runs
    at its next scan and deletes it (:func:`final_words`).  Written atomically,
    0600, as ``<name>@<pid>-<ns>.final`` beside the record; at most
    :data:`FINAL_KEEP` are kept when no server takes them up.
    """
    if not valid_name(name):
        raise ClusterError(f"{name!r} is not a valid cluster name; use letters, digits, '-', '_' or '.' (at most 63).")
    directory = registry_dir()
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=FINAL)  # 0600: jobs are the user's alone
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, separators=(",", ":"), default=str)
        path = os.path.join(directory, f"{name}@{os.getpid()}-{time.time_ns()}{FINAL}")
        os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
    old = sorted((p for p, _ in _final_paths()), key=mtime)
    for p in old[: max(0, len(old) - FINAL_KEEP)]:
        remove_final(p)
    return path


def _final_paths() -> list[tuple[str, str]]:
    """``(path, cluster name)`` of each file named as a final word."""
    directory = registry_dir()
    out = []
    for entry in sorted(os.listdir(directory)):
        match = _FINAL_FILE.fullmatch(entry)
        if match:
            out.append((os.path.join(directory, entry), match.group("name")))
    return out


def final_words(skip: Container[str] = ()) -> list[tuple[str, dict[str, Any]]]:
    """``(path, data)`` of each final word (:func:`write_final`), oldest first.

    Only this user's regular files, 0600, of at most :data:`FINAL_MAX_BYTES`,
    holding a JSON object whose ``key`` is the cluster name the file is named
    after.  Others' files (or links) are never read and are left alone.  Any
    other file named as a final word is none an owner wrote (they write it
    whole, then rename it): it is deleted, lest it be read again at every scan.
    Nothing read is evaluated: the reader checks each field.

    Parameters
    ----------
    skip : container of str
        Paths not to read (those the reader found damaged, or left for later).
    """
    out = []
    for path, name in sorted(_final_paths(), key=lambda p: mtime(p[0])):
        if path in skip:
            continue
        try:
            data = read_json(path, FINAL_MAX_BYTES, private=True)
        except OSError:  # gone meanwhile, or not this user's private file (PermissionError)
            continue
        except (ValueError, RecursionError):  # too large, not JSON (nor UTF-8), nested too deeply
            data = None
        if isinstance(data, dict) and data.get("key") == name:
            out.append((path, data))
        else:
            remove_final(path)
    return out


def remove_final(path: str) -> None:
    """Delete a final word once taken up (only a file named as one, in the registry folder)."""
    if os.path.dirname(path) != registry_dir() or not _FINAL_FILE.fullmatch(os.path.basename(path)):
        return
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
