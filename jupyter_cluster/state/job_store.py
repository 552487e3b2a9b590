"""Where detached jobs keep what they are and what they computed: one 0700 folder per job.

``<store>/<name>/`` (store: ``jupyter-cluster.detached.store-dir``, by default
``<jupyter data dir>/jupyter-cluster/jobs``) holds, all 0600:

* ``spec.pkl`` -- the function, the items and the map options (cloudpickle),
  written once by the kernel that submitted the job;
* ``meta.json`` -- name, cluster, notebook, cell, state, counts, times; replaced
  atomically by whoever changes it (the host that drives the job);
* ``results.bin`` -- append-only records, one per finished item, written as the
  results arrive: ``magic, index, kind, length, crc32`` then ``length`` bytes
  of pickle.  A reader takes records up to the first one that is cut short or
  whose checksum does not match (a writer killed mid-record); a writer that
  resumes the job first cuts the file back to its last whole record.  So a
  driver killed with -9 leaves every finished item, and nothing half-written
  is ever read back as a result;
* ``run.json`` -- the latest run message of the job's map (notebook, cell,
  counts, at the end its items), which ``jc.runs()`` in any kernel lists.

A job's requests to the host that drives it (run, resume, cancel) are small
files in ``<store>/.inbox/<cluster>/`` that the host reads and deletes.

The folder is this user's alone (0700; another user's is refused), and the
results of all jobs together are bounded (``detached.store-limit``): past it
the oldest ended jobs' results are deleted and their metadata says so.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import re
import struct
import tempfile
import time
import zlib
from collections.abc import Iterator
from typing import Any

from .. import config
from ..errors import ClusterError
from .registry import private_folder

SPEC = "spec.pkl"
META = "meta.json"
RESULTS = "results.bin"
RUN = "run.json"
INBOX = ".inbox"
#: a record's header: magic, input index, kind (0 result, 1 error), payload length, payload crc32
_HEADER = struct.Struct("<4sQBQI")
_MAGIC = b"JCR1"
KIND_RESULT, KIND_ERROR = 0, 1
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
#: states of a job; "lost": its host died while it ran (resume() runs the rest)
ENDED = ("finished", "failed", "cancelled", "evicted")


def valid_name(name: object) -> bool:
    """Whether ``name`` can name a detached job (and so a folder of the store)."""
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


def check_name(name: object) -> str:
    if not valid_name(name):
        raise ClusterError(
            f"{name!r} is not a valid job name; use letters, digits, '-', '_' or '.' (at most 63, not starting with a dot)."
        )
    return str(name)


def store_dir() -> str:
    """The store's folder: created 0700 on demand; refused when it is not this user's."""
    path = config.get("detached.store-dir")
    if not path:
        from jupyter_core.paths import jupyter_data_dir

        path = os.path.join(jupyter_data_dir(), "jupyter-cluster", "jobs")
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    except PermissionError:
        pass  # said in one sentence by private_folder below
    return private_folder(
        path, "the detached jobs' folder", "remove it or set jupyter-cluster.detached.store-dir to a private folder"
    )


def job_dir(name: str, create: bool = False) -> str:
    path = os.path.join(store_dir(), check_name(name))
    if create:
        os.mkdir(path, 0o700)  # FileExistsError: the name is taken
    return path


def _write_atomic(path: str, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:  # mkstemp makes it 0600
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except FileNotFoundError:
            pass
        raise


# -- creating and describing jobs ---------------------------------------------------------------
def create(name: str, spec: bytes, meta: dict[str, Any]) -> None:
    """Make the job's folder with its spec and first metadata; refuses a name in use."""
    try:
        path = job_dir(name, create=True)
    except FileExistsError:
        raise ClusterError(
            f"a detached job named {name!r} already exists; choose another name, or remove it with "
            f"jupyter_cluster.job({name!r}).remove()."
        ) from None
    try:
        _write_atomic(os.path.join(path, SPEC), spec)
        write_meta(name, meta)
    except BaseException:
        remove(name)
        raise


def read_spec(name: str) -> bytes:
    with open(os.path.join(job_dir(name), SPEC), "rb") as f:
        return f.read()


def write_meta(name: str, meta: dict[str, Any]) -> None:
    _write_atomic(os.path.join(job_dir(name), META), json.dumps(meta).encode())


def read_meta(name: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(job_dir(name), META), "rb") as f:
            data = json.loads(f.read())
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def update_meta(name: str, **changes: Any) -> dict[str, Any]:
    """Change some fields of the metadata (only the job's driver writes, so no lock is needed)."""
    meta = read_meta(name) or {}
    meta.update(changes)
    write_meta(name, meta)
    return meta


def write_run(name: str, message: dict[str, Any]) -> None:
    """Keep the latest run message of the job's map (``run.json``), for ``jc.runs()`` in any kernel."""
    _write_atomic(os.path.join(job_dir(name), RUN), json.dumps(message, default=str).encode())


def read_run(name: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(job_dir(name), RUN), "rb") as f:
            data = json.loads(f.read())
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def names() -> list[str]:
    """Every job in the store, oldest first."""
    root = store_dir()
    found = []
    for entry in os.listdir(root):
        if valid_name(entry) and os.path.isfile(os.path.join(root, entry, META)):
            found.append((os.stat(os.path.join(root, entry, META)).st_ctime, entry))
    return [n for _, n in sorted(found)]


def remove(name: str) -> None:
    """Delete the job's folder and everything in it."""
    path = job_dir(name)
    for entry in os.listdir(path) if os.path.isdir(path) else ():
        os.remove(os.path.join(path, entry))
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass


# -- results ------------------------------------------------------------------------------------
class ResultWriter:
    """Appends one record per finished item to a job's ``results.bin`` (the host's side)."""

    def __init__(self, name: str):
        self.path = os.path.join(job_dir(name), RESULTS)
        valid = _valid_length(self.path)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        os.ftruncate(fd, valid)  # a record cut short by a killed writer goes before anything is added
        os.lseek(fd, 0, os.SEEK_END)
        self._fd = fd
        self.bytes = valid

    def add(self, index: int, value: Any, error: bool = False) -> None:
        """Write one item's result (or its exception) as a whole record.

        Raises
        ------
        OSError
            When the disk is full (``errno.ENOSPC``): the partial record is cut
            off again, so readers never see it.
        """
        payload = _dumps(value)
        record = _HEADER.pack(_MAGIC, index, KIND_ERROR if error else KIND_RESULT, len(payload), zlib.crc32(payload))
        data = record + payload
        try:
            view = memoryview(data)
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
        except OSError:
            try:
                os.ftruncate(self._fd, self.bytes)
                os.lseek(self._fd, self.bytes, os.SEEK_SET)
            except OSError:
                pass
            raise
        self.bytes += len(data)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _dumps(value: Any) -> bytes:
    import cloudpickle

    try:
        return cloudpickle.dumps(value)
    except Exception as exc:  # a result that cannot be pickled: say so in its place
        return cloudpickle.dumps(
            TypeError(f"the result ({type(value).__name__}) could not be kept: {type(exc).__name__}: {exc}")
        )


def _records(path: str) -> Iterator[tuple[int, int, int, int]]:
    """``(index, kind, offset of payload, length)`` of every whole, intact record, in file order."""
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return
    with f:
        size = os.fstat(f.fileno()).st_size
        pos = 0
        while pos + _HEADER.size <= size:
            f.seek(pos)
            magic, index, kind, length, crc = _HEADER.unpack(f.read(_HEADER.size))
            start = pos + _HEADER.size
            if magic != _MAGIC or start + length > size:
                return
            if zlib.crc32(f.read(length)) != crc:
                return
            yield index, kind, start, length
            pos = start + length


def _valid_length(path: str) -> int:
    end = 0
    for _, _, start, length in _records(path):
        end = start + length
    return end


def done_indices(name: str) -> dict[int, int]:
    """Input index -> kind, for every item with a whole record."""
    return {index: kind for index, kind, _, _ in _records(os.path.join(job_dir(name), RESULTS))}


def read_results(name: str) -> dict[int, tuple[int, Any]]:
    """Input index -> ``(kind, value)`` for every item with a whole record (the last one wins)."""
    path = os.path.join(job_dir(name), RESULTS)
    out: dict[int, tuple[int, Any]] = {}
    records = list(_records(path))
    if not records:
        return out
    with open(path, "rb") as f:
        for index, kind, start, length in records:
            f.seek(start)
            out[index] = (kind, pickle.loads(f.read(length)))
    return out


def results_bytes(name: str) -> int:
    try:
        return os.stat(os.path.join(job_dir(name), RESULTS)).st_size
    except FileNotFoundError:
        return 0


def disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


# -- the bound --------------------------------------------------------------------------------
def store_limit() -> int:
    from dask.utils import parse_bytes

    limit = config.get("detached.store-limit")
    return int(parse_bytes(limit)) if isinstance(limit, str) else int(limit or 0)


def result_ttl() -> float:
    """How long an ended job's results are kept, in seconds (``detached.result-ttl``; 0 = until fetched or removed)."""
    from dask.utils import parse_timedelta

    ttl = config.get("detached.result-ttl", "14d")
    return float(parse_timedelta(ttl) or 0) if ttl not in (None, 0, "0") else 0.0


def _evict(name: str, reason: str) -> None:
    try:
        os.remove(os.path.join(job_dir(name), RESULTS))
    except FileNotFoundError:
        pass
    update_meta(name, state="evicted", evicted=time.time(), reason=reason)


def evict_expired(now: float | None = None) -> list[str]:
    """Delete the results of jobs that ended longer ago than ``detached.result-ttl``; returns their names.

    As with the size bound, the metadata stays (state ``"evicted"``, with the reason), so
    ``job(NAME)`` says what became of the results.
    """
    ttl = result_ttl()
    if ttl <= 0:
        return []
    now = time.time() if now is None else now
    expired = []
    for name in names():
        meta = read_meta(name) or {}
        ended = meta.get("ended")
        if meta.get("state") in ("finished", "failed", "cancelled") and isinstance(ended, (int, float)):
            if now - ended > ttl:
                days = ttl / 86400
                _evict(name, f"its results expired {days:g} days after the job ended (detached.result-ttl)")
                expired.append(name)
    return expired


def evict_over_limit(keep: str | None = None) -> list[str]:
    """Delete the results of the oldest ended jobs until the store is under its limit; returns their names.

    The metadata stays, in state ``"evicted"`` with the time and the reason, so
    that ``job(NAME)`` says what became of them.  ``keep`` (the job being
    written) and running jobs are never evicted.  Expired results
    (:func:`evict_expired`) go first.
    """
    evicted = evict_expired()
    limit = store_limit()
    if limit <= 0:
        return evicted
    jobs = names()
    sizes = {n: results_bytes(n) for n in jobs}
    total = sum(sizes.values())
    for name in jobs:  # oldest first
        if total <= limit:
            break
        meta = read_meta(name) or {}
        if name == keep or meta.get("state") not in ("finished", "failed", "cancelled") or not sizes[name]:
            continue
        total -= sizes[name]
        _evict(
            name,
            f"its results were deleted to keep the detached jobs' results under {limit / 1e9:g} GB "
            "(detached.store-limit), oldest first",
        )
        evicted.append(name)
    return evicted


# -- requests to a cluster's host ------------------------------------------------------------------
def inbox_dir(cluster: str) -> str:
    path = os.path.join(store_dir(), INBOX)
    private_folder(path, "the detached jobs' inbox")
    return private_folder(os.path.join(path, cluster), "the detached jobs' inbox")


def post(cluster: str, job: str, op: str) -> None:
    """Ask the host of ``cluster`` to ``op`` ("run", "resume", "cancel") the job ``job``."""
    # named by the time: the host takes them in the order they were posted
    entry = f"{time.time_ns():020d}.{check_name(job)}.{op}.req"
    _write_atomic(os.path.join(inbox_dir(cluster), entry), json.dumps({"op": op, "job": job}).encode())


def take_requests(cluster: str) -> list[tuple[str, str]]:
    """The requests waiting for ``cluster``'s host, oldest first, each deleted as it is taken."""
    path = inbox_dir(cluster)
    out = []
    for entry in sorted(e for e in os.listdir(path) if e.endswith(".req")):
        stamp, _, rest = entry[: -len(".req")].partition(".")
        job, _, op = rest.rpartition(".")
        try:
            os.remove(os.path.join(path, entry))
        except FileNotFoundError:
            continue
        if stamp.isdigit() and valid_name(job) and op in ("run", "resume", "cancel"):
            out.append((job, op))
    return out
