"""The direct path's wire format, shared by the client (:mod:`.direct`) and the workers (:mod:`.worker`).

Every message of the direct path is a Dask comm request to one of the
handlers :class:`.worker.handlers.EnginePlugin` registers (:class:`Op`); every
answer carries a :class:`Status`.  The tuples that travel are
:class:`typing.NamedTuple`\\ s, so both sides name their fields; on the wire
they are plain msgpack arrays (a relay forwards them without unpickling).
Items and results travel pickled in one piece (:func:`pack`/:func:`unpack`).

A chunk's result (:class:`ChunkResult`) and an item's error
(:class:`ItemError`) travel as plain tuples in their fields' order, and the
client reads them with ``ChunkResult._make(t)`` / ``ItemError._make(t)``:
pickling the NamedTuple itself adds a class reference to every result
(10,000 small results: 168 -> 220 bytes and 3-5 -> 13-22 us each to pickle,
against 0.4-0.8 us for ``_make`` on the client).

Only the standard library, msgpack, cloudpickle and distributed are imported
here: this module is loaded into every worker process.
"""

from __future__ import annotations

import pickle
from enum import Enum
from typing import Any, NamedTuple

import cloudpickle
import msgpack


class RemoteItemError(Exception):
    """Stands for an exception raised on a worker that could not be sent back as itself."""


class Op:
    """Names of the comm handlers every worker of a cluster gets (``worker.handlers[...]``)."""

    #: Wait until a lease runs on the worker; answers READY, WAITING, GONE or REFUSED.
    ATTACH = "jc_attach"
    #: Run a batch on a lease; answers OK (with the result), NEED_FN, WAITING, GONE or REFUSED.
    BATCH = "jc_batch"
    #: Forward a group's batches to their leases and answer with all of them.
    RELAY = "jc_relay"
    #: One batch a relay forwarded (its fields in one msgpack).
    RELAYED = "jc_relayed"
    #: End a lease now.
    CLOSE = "jc_close"
    #: Is the engine there? (the reachability check and the warm-up's connections)
    PING = "jc_ping"


class Status(str, Enum):
    """What a worker answers to a request (``{"status": status.value, ...}``)."""

    OK = "ok"  # the batch ran: ``result`` holds it
    READY = "ready"  # the lease runs here (attach)
    NEED_FN = "need-fn"  # the worker process dropped the map's function from its cache: send it again
    WAITING = "waiting"  # the lease has not started here in time (queued behind other work)
    GONE = "gone"  # the lease ended before it ran the batch
    REFUSED = "refused"  # wrong secret: not the client that placed the lease
    UNREACHABLE = "unreachable"  # a relay could not reach the batch's worker (``connected``: whether it had)

    @classmethod
    def of(cls, answer: Any) -> Status | None:
        """The status of a worker's answer, None for an answer that has none (or an unknown one)."""
        raw = answer.get("status") if isinstance(answer, dict) else None
        try:
            return cls(raw)
        except ValueError:
            return None


def answer(status: Status, **fields: Any) -> dict[str, Any]:
    """A handler's answer: plain strings on the wire."""
    return {"status": status.value, **fields}


class MapRun(NamedTuple):
    """What a worker needs of a map to run its items: one value per map, built once (:class:`.job.MapJob`).

    It travels whole with every batch (a msgpack array of its fields) and
    every task, and is unpacked in one place, :func:`.worker.run.run_chunk`.
    ``blob`` is None once the worker process has the function (the direct
    path sends it to each worker process once) or when it travels among the
    map's large values (``big["__fn__"]``).
    """

    token: str  # the map's id: the function's key in each worker process's cache
    blob: bytes | None  # cloudpickle of the function or CellFunction
    star: bool  # call fn(*item)
    retries: int  # times an item that raised is run again
    timeout: float | None  # seconds an item may run (None: no limit)
    capture: bool  # capture what items print, item by item

    def without_function(self) -> MapRun:
        """This run with its function left out (the worker process has it already, or it is not sent any more)."""
        return self._replace(blob=None) if self.blob is not None else self

    @classmethod
    def of(cls, wire: Any) -> MapRun:
        """The run of what came over the comm (a list or tuple off msgpack, a :class:`Packed`, or the run itself)."""
        if isinstance(wire, cls):
            return wire
        return cls._make(wire.value if isinstance(wire, Packed) else wire)


class Batch(NamedTuple):
    """A batch in a lease's mailbox, and the future its ``jc_batch`` call waits on."""

    run: Any  # MapRun as received (a list or tuple off the wire)
    items: Any  # as pack() made it: the lease's own thread unpickles it (lease._run_entry)
    budget: float | None
    reply: Any  # asyncio.Future on the worker's loop


class RelayEntry(NamedTuple):
    """One batch of a relay group, as the client hands it to the relay."""

    addr: str
    lease: str
    secret: str
    run: Any  # MapRun
    items: Any  # as pack() made it
    budget: float | None


class Relayed(NamedTuple):
    """One batch a relay forwards to its worker's ``jc_relayed``: a :class:`RelayEntry` less the address."""

    lease: str
    secret: str
    run: Any  # MapRun, as a list off the wire
    items: Any  # as pack() made it
    budget: float | None


class ChunkResult(NamedTuple):
    """What :func:`.worker.run.run_chunk` returns for a chunk (a plain tuple on the wire: read with ``_make``)."""

    values: list  # one per item run; fewer than the chunk's items when it stopped early
    timings: list  # (items, seconds each) runs in item order: (1, d) per item, or (n, mean) per slice
    outputs: dict[int, str] | None  # position -> printed text (None when empty)
    errors: dict[int, tuple] | None  # position -> an ItemError's fields (None when empty)
    worker: str | None  # the worker's address
    started: float  # time.time() at the chunk's start


class PackedResult(NamedTuple):
    """A chunk's result that :func:`.worker.run.run_chunk` packed (``packed=True``): sent on as it is."""

    data: Any  # what pack() made of the ChunkResult's fields


class ItemError(NamedTuple):
    """One failed item, as :func:`.worker.run.error_info` makes it (a plain tuple on the wire: read with ``_make``)."""

    exc: BaseException | None  # the exception itself, or None when it cannot be pickled
    type_name: str  # its type's qualified name
    message: str  # str(exc)
    text: str  # the formatted remote traceback
    frames: dict | None  # tblib's dict of the traceback (None without tblib)


class Packed:
    """A value that travels over the comm pickled in one piece.

    Dask's serialisation walks lists, tuples and dicts element by element
    (measured: 240 ms for a batch of 10,000 integers and its results, against
    2 ms in one pickle), so batches and results travel wrapped in this.
    """

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __reduce__(self):
        return (Packed, (self.value,))


class Items:
    """A task-path chunk's items and time budget, opaque to Dask.

    ``client.submit`` walks list arguments element by element looking for
    futures to resolve (about 15 µs per item on the client, more than
    everything else the engine does per item).  Items are plain data to the
    engine, so they travel in this wrapper and Dask pickles them in one go.
    """

    __slots__ = ("items", "budget")

    def __init__(self, items: list, budget: float | None = None):
        self.items = items
        self.budget = budget

    def __reduce__(self):
        return (Items, (self.items, self.budget))


#: A batch's items or result pickled to at most this many bytes travels inside the message as bytes.
INLINE_BYTES = 4 * 1024 * 1024


def pack(value: Any) -> Any:
    """``value`` ready for the comm: its pickle as ``bytes``, or Dask frames when large.

    Bytes travel inside Dask's msgpack message, past Dask's serialisation
    machinery (a dispatch, a header, a compression check, a size estimate:
    about a fifth of a worker's CPU per batch when hundreds of small batches
    pass, profiled in benchmarks/scale_sim.py), and a relay forwards them
    without unpickling.  Values holding out-of-band buffers (arrays) or
    pickling to more than :data:`INLINE_BYTES` travel as frames
    (:class:`Packed`), which Dask sends without copying.  Pickled like Dask
    pickles (cloudpickle for what plain pickle cannot take).
    """
    return _pack(value, plain_only=False)


def pack_plain(value: Any) -> Any:
    """:func:`pack`'s result when plain pickle takes ``value``, else None (nothing else is tried).

    A chunk's result packed so (:func:`.worker.run.run_chunk`, ``packed=True``)
    needs no check that its values can be sent back: plain pickle took them all.
    """
    return _pack(value, plain_only=True)


def _pack(value: Any, plain_only: bool) -> Any:
    from distributed.protocol import to_serialize

    buffers: list = []
    try:
        # Plain pickle first: Dask's own dumps also asks inspect.getmodule() of the value, which for a
        # list raises and catches an exception inside (4 µs of a 0.4 µs pickle; 256 batches a round).
        blob = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    except Exception:  # noqa: BLE001 - what plain pickle cannot take, Dask's dumps (cloudpickle) may
        if plain_only:
            return None
        blob = None
    if blob is None or b"__main__" in blob or cloudpickle.list_registry_pickle_by_value():
        from distributed.protocol import pickle as dask_pickle

        buffers.clear()
        blob = dask_pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    if not buffers and len(blob) <= INLINE_BYTES:
        return blob
    return to_serialize(Packed(value))


def unpack(data: Any) -> Any:
    """The value of what :func:`pack` made, once received (or still local: a ``Serialize``)."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        from distributed.protocol import pickle as dask_pickle

        return dask_pickle.loads(data)
    data = getattr(data, "data", data)  # a local Serialize
    return data.value if isinstance(data, Packed) else data


def forwardable(data: Any) -> Any:
    """What :func:`pack` made, received by a relay, ready to send on without unpickling it."""
    if data is None or isinstance(data, (bytes, list, tuple)):
        return data
    from distributed.protocol import to_serialize

    return to_serialize(Packed(unpack(data)))


def wire_run(run: Any) -> Any:
    """A map's ``run`` as sent over the comm (plain msgpack: its function, if any, is bytes already)."""
    return run.value if isinstance(run, Packed) else run


def pack_group(entries: list[RelayEntry]) -> Any:
    """A relay group's entries for the ``jc_relay`` message.

    When every batch's items are bytes (:func:`pack`), each batch becomes
    one msgpack payload that the relay forwards as it is (``jc_relayed``),
    and the group one msgpack of ``(address, payload)`` pairs.  Dask walks
    a message's lists, tuples and dicts to estimate its size before sending
    it and msgpack walks them again (measured: 170 µs for a group of 32
    batches on the client, 25 µs for each member's message on its relay),
    against a few µs for bytes.  msgpack, not pickle: nothing is unpickled
    before the lease's secret is checked.  Otherwise (items that travel as
    frames) the plain list, which Dask sends without copying their buffers.
    """
    if not all(isinstance(e.items, bytes) for e in entries):
        return entries
    try:
        pairs = [
            (e.addr, msgpack.packb(Relayed(e.lease, e.secret, e.run, e.items, e.budget), use_bin_type=True))
            for e in entries
        ]
        return msgpack.packb(pairs, use_bin_type=True)
    except (TypeError, ValueError):  # a run that msgpack cannot take (not made by MapJob): the plain list
        return entries


def unpack_relayed(payload: bytes) -> Relayed:
    """The :class:`Relayed` batch of one payload :func:`pack_group` made."""
    return Relayed._make(msgpack.unpackb(payload, use_list=False))


def unpack_group(entries: bytes) -> tuple:
    """The ``(address, payload)`` pairs of a group :func:`pack_group` made."""
    return msgpack.unpackb(entries, use_list=False)


def pack_answers(answers: list) -> Any:
    """A relay's answers as one msgpack (as :func:`pack_group`), or the list when a result travels as frames."""
    try:
        return msgpack.packb(answers, use_bin_type=True)
    except (TypeError, ValueError):
        return answers


def unpack_answers(answers: Any) -> list:
    """The list of answers :func:`pack_answers` made, once received."""
    if isinstance(answers, bytes):
        return msgpack.unpackb(answers)
    return getattr(answers, "value", answers)
