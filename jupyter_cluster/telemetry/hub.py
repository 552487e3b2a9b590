"""Receiving telemetry: one way to subscribe to a Dask event topic and replay its backlog.

:func:`follow` is used by the kernel (:class:`Hub`, every metrics topic of a
cluster) and by the Jupyter server (:mod:`jupyter_cluster.server.manager`, the
metrics and the jobs topics): subscribe, confirm the subscription with a marker
that comes back live, replay the scheduler's backlog, then hand on the live
events held meanwhile, each event once.  :func:`metrics` turns a store into a
DataFrame; :func:`sync` waits for what is already on its way (cell end).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ..errors import ClusterError
from .producer import current_handle, flush_plugin, send_buffered
from .topic_names import INDEX_TOPIC, PLUGIN_NAME, PREFIX
from .topic_store import TopicStore, store

if TYPE_CHECKING:
    from distributed import Client

logger = logging.getLogger(__name__)

#: Set (True) on a cluster object whose every worker process gets :func:`.report.flush_plugin` as it
#: starts, before it registers with the scheduler (a local cluster: ``backends.local``).
FLUSH_AT_SPAWN = "_jc_flush_at_spawn"


async def follow(
    client: Client,
    topic: str,
    on_event: Callable[[str, Any], None],
    backlog: Callable[[str], bool] | None = None,
    seen: dict[str, float] | None = None,
    timeout: float = 10.0,
    strict: bool = False,
) -> None:
    """Subscribe ``on_event`` to the Dask event ``topic``, replay the scheduler's backlog, each event once.

    Runs on ``client``'s event loop (a synchronous client: through
    ``client.sync``).  The subscription travels on the client's batched stream
    and the backlog request on an RPC connection, so a marker is logged on
    ``topic`` until it comes back live: from then on nothing can fall between
    the backlog and the live feed.  Live events that arrive before the
    backlog has been replayed are held and handed on after it.

    Parameters
    ----------
    client : distributed.Client
    topic : str
        The Dask topic to follow live.
    on_event : callable
        ``on_event(dask_topic, msg)``, on the client's event loop; ``dask_topic``
        is ``topic`` for live events and the backlog's own topic for replayed ones.
    backlog : callable, optional
        Which Dask topics' backlog to replay (``backlog(dask_topic) -> bool``);
        by default ``topic``'s own.
    seen : dict, optional
        Dask topic -> timestamp of the newest event handed on; events no newer
        are skipped (the scheduler stamps an event once, so its backlog copy
        and its live copy carry the same time).  Pass the same dict again after
        a reconnect so nothing is handed on twice.
    timeout : float
        Seconds to wait for the marker and for the backlog.
    strict : bool
        Raise ``TimeoutError`` (or the scheduler's error) when the backlog
        cannot be read, instead of following the live feed without it: the
        Jupyter server then connects again, since what was sent before its
        subscription (a map that ended right after the cluster started) is
        in the backlog only.

    When it fails (an error, a cancelled caller) it hands nothing more on:
    the events it held back are in the scheduler's backlog for the next
    ``follow`` with the same ``seen``, and handing them on first would make
    that backlog look already seen.
    """
    seen = {} if seen is None else seen
    token = uuid.uuid4().hex
    confirmed = asyncio.Event()
    held: list[tuple[str, tuple[float, Any]]] | None = []
    failed = False

    def hand_on(dask_topic: str, event: tuple[float, Any]) -> None:
        ts, msg = event
        if ts <= seen.get(dask_topic, float("-inf")):
            return
        seen[dask_topic] = ts
        on_event(dask_topic, msg)

    def live(event: tuple[float, Any]) -> None:
        msg = event[1]
        if isinstance(msg, dict) and msg.get("sync") == token:
            confirmed.set()
        elif failed:
            return
        elif held is not None:
            held.append((topic, event))
        else:
            hand_on(topic, event)

    client.subscribe_topic(topic, live)
    try:
        scheduler = client.scheduler
        assert scheduler is not None  # a connected client
        deadline = time.monotonic() + timeout
        wait = 0.005
        while not confirmed.is_set():
            await scheduler.log_event(topic=topic, msg={"sync": token})
            try:
                await asyncio.wait_for(confirmed.wait(), wait)
            except asyncio.TimeoutError:
                if time.monotonic() > deadline:
                    if strict:
                        raise TimeoutError(
                            f"the scheduler did not confirm the subscription to {topic} in {timeout} s"
                        ) from None
                    logger.warning(
                        "subscription to %s not confirmed after %s s; early events may be missing", topic, timeout
                    )
                    break
                wait = min(0.1, wait * 2)
        try:
            # one topic's backlog when one is wanted: a smaller answer than every topic's, from a busy scheduler
            ask = scheduler.events() if backlog is not None else scheduler.events(topic=topic)
            answer = await asyncio.wait_for(ask, max(deadline - time.monotonic(), 1.0 if not strict else timeout / 2))
        except Exception:  # no backlog is no reason to stop following the live feed (unless strict)
            if strict:
                raise
            logger.debug("no backlog of %s", topic, exc_info=True)
            answer = {}
        everything = answer if isinstance(answer, dict) else {topic: answer}
        want = backlog or (lambda t: t == topic)
        for dask_topic, events in everything.items():
            if want(dask_topic):
                for event in events:
                    if not _is_marker(event[1]):  # the markers of this and earlier follows stay in the backlog
                        hand_on(dask_topic, tuple(event))
    except BaseException:
        failed = True
        held = None
        raise
    pending, held = held or [], None
    for dask_topic, event in pending:
        hand_on(dask_topic, event)


def _is_marker(msg: Any) -> bool:
    return isinstance(msg, dict) and len(msg) == 1 and "sync" in msg


class Hub:
    """One client's live feed of every metrics topic of its cluster.

    Every batch is logged on its own topic *and* on :data:`INDEX_TOPIC`, so a
    single subscription (made before the work starts) receives all topics,
    new ones included.  On attaching, the scheduler's per-topic backlogs are
    merged in; a late start loses only what the scheduler has already
    forgotten, and that loss is counted in :attr:`TopicStore.dropped`.

    Parameters
    ----------
    client : distributed.Client
    stores : dict, optional
        Where to keep topics (``topic -> TopicStore``); defaults to this
        process's stores (:func:`store`).  The server extension passes its own.
    """

    def __init__(self, client: Client, stores: dict[str, TopicStore] | None = None) -> None:
        self.client = client
        self.stores = stores
        self._lock = threading.Lock()
        #: set once :meth:`attach` has merged the backlog
        self.ready = threading.Event()
        self._waiters: dict[str, threading.Event] = {}
        self._seen: set[str] = set()
        #: called with a topic name the first time this hub receives it
        self.callbacks: list[Callable[[str], None]] = []

    def store(self, topic: str) -> TopicStore:
        """The store this hub fills for ``topic``."""
        if self.stores is None:
            return store(topic)
        with self._lock:
            s = self.stores.get(topic)
            if s is None:
                s = self.stores[topic] = TopicStore(topic)
            return s

    def ingest(self, msg: Any, topic: str | None = None) -> int:
        """Add one batch message; returns how many of its reports were new."""
        if not isinstance(msg, dict) or "records" not in msg:
            return 0
        topic = topic or msg.get("topic")
        if not isinstance(topic, str):
            return 0
        n = self.store(topic).add(
            str(msg.get("source")), int(msg.get("seq", 0)), list(msg["records"]), msg.get("worker")
        )
        if topic not in self._seen:
            self._seen.add(topic)
            self._announce(topic)
        return n

    def _on_event(self, dask_topic: str, msg: Any) -> None:
        if isinstance(msg, dict) and "sync" in msg:  # a marker of :meth:`sync`
            waiter = self._waiters.get(msg["sync"])
            if waiter is not None:
                waiter.set()
            return
        self.ingest(msg, dask_topic[len(PREFIX) :] if dask_topic.startswith(PREFIX) else None)

    def sync(self, timeout: float = 2.0) -> bool:
        """Wait until every report the scheduler had received when called has reached this hub.

        A marker is logged on the index topic and waited for: the scheduler
        forwards events in order.  Returns False after ``timeout`` seconds.
        """
        token = uuid.uuid4().hex
        waiter = self._waiters[token] = threading.Event()
        try:
            self.client.log_event(INDEX_TOPIC, {"sync": token})
            return waiter.wait(timeout)
        except Exception:  # a closed client: nothing more will arrive anyway
            return False
        finally:
            self._waiters.pop(token, None)

    def attach(self, timeout: float = 10.0) -> None:
        """Subscribe and merge the backlog (from any thread but the client's event loop)."""
        # A local cluster's workers start with the plugin (backends.local): no broadcast on the first map.
        if not getattr(getattr(self.client, "cluster", None), FLUSH_AT_SPAWN, False):
            try:
                self.client.register_plugin(flush_plugin(), name=PLUGIN_NAME)
            except Exception:  # workers without jupyter_cluster still send on the ~100 ms timer
                logger.debug("could not register the flush plugin", exc_info=True)
        self.client.sync(self.follow, timeout=timeout)

    async def follow(self, timeout: float = 10.0, strict: bool = False) -> None:
        """:func:`follow` the index topic into the stores, on the client's event loop."""
        await follow(
            self.client,
            INDEX_TOPIC,
            self._on_event,
            backlog=lambda t: t.startswith(PREFIX),
            timeout=timeout,
            strict=strict,
        )

    def _announce(self, topic: str) -> None:
        for cb in list(self.callbacks):
            try:
                cb(topic)
            except Exception:
                logger.exception("topic callback failed")

    def detach(self) -> None:
        """Stop receiving (the stores keep what they have)."""
        try:
            self.client.unsubscribe_topic(INDEX_TOPIC)
        except Exception:
            pass


_hubs: dict[str, Hub] = {}
_hubs_lock = threading.Lock()


def attach(client: Client | None = None) -> Hub:
    """Make sure this process receives every metrics topic of ``client``'s cluster.

    Idempotent and cheap after the first call.  Called automatically when a
    map starts and by :func:`metrics` / :func:`show_metrics`, so reports
    from tasks are collected from the start.

    Parameters
    ----------
    client : distributed.Client, optional
        Defaults to the current cluster's client.
    """
    if client is None:
        handle = current_handle()
        if handle is None:
            raise ClusterError("no cluster is running in this kernel; start one with %cluster start.")
        client = handle.client
    with _hubs_lock:
        existing = _hubs.get(client.id)
        if existing is None:
            hub = _hubs[client.id] = Hub(client)
    if existing is not None:  # another thread is attaching (e.g. at the start of a map): wait for its backlog
        existing.ready.wait(30)
        return existing
    try:
        hub.attach()
    except BaseException:
        with _hubs_lock:
            _hubs.pop(client.id, None)
        raise
    finally:
        hub.ready.set()
    return hub


def sync(timeout: float = 2.0, workers: bool = False) -> bool:
    """Wait until the reports already at the schedulers this process follows have arrived here.

    Used when a cell ends, so the live charts saved with the notebook are
    complete.

    Parameters
    ----------
    timeout : float
        Seconds to wait for each step (workers, then the scheduler).
    workers : bool
        First have every worker send the reports it still buffers (they
        leave on a ~100 ms timer, or at the end of a task; a map's direct
        batches end no task).

    Returns
    -------
    bool
        False if a worker or a scheduler did not answer in time.
    """
    with _hubs_lock:
        # A stopped cluster's client sends nothing more: waiting on it would only make every later
        # sync() report a timeout.
        hubs = [h for h in _hubs.values() if h.ready.is_set() and h.client.status not in ("closing", "closed")]
    ok = True
    for hub in hubs:
        if workers:
            ok = _flush_workers(hub.client, timeout) and ok
        ok = hub.sync(timeout) and ok
    return ok


def _flush_workers(client: Client, timeout: float) -> bool:
    from concurrent.futures import ThreadPoolExecutor
    from concurrent.futures import TimeoutError as FuturesTimeout

    pool = ThreadPoolExecutor(1, thread_name_prefix="jupyter-cluster-flush")
    try:
        pool.submit(client.run, send_buffered, on_error="ignore").result(timeout)
        return True
    except FuturesTimeout:  # a worker whose event loop is busy: its reports come on its timer
        return False
    except Exception:  # a closing client or cluster
        logger.debug("could not flush the workers' reports", exc_info=True)
        return False
    finally:
        pool.shutdown(wait=False)


def attached(client: Client) -> bool:
    """Whether :func:`attach` has run for ``client``."""
    return client.id in _hubs


def metrics(topic: str = "default", cluster=None):
    """What has been reported on ``topic`` so far, one row per report.

    Parameters
    ----------
    topic : str
    cluster : ClusterHandle, optional
        Whose reports to collect as well; defaults to the current cluster.

    Returns
    -------
    pandas.DataFrame or list of dict
        Columns ``step``, ``time`` (when it was reported, a UTC datetime
        column; epoch seconds in the list form), ``worker``, the identity
        fields, then one column per value (vectors hold lists).  A DataFrame when pandas is
        installed, else a list of dicts.  ``.attrs["dropped"]`` (DataFrame)
        says how many reports never arrived, ``.attrs["evicted"]`` how many
        arrived but were pushed out, the oldest first, by the history cap
        (``jupyter-cluster.metrics.history``, 100,000 rows per topic).

    Examples
    --------
    >>> df = jc.metrics("es")                                   # doctest: +SKIP
    >>> df.pivot_table(index="step", columns="member", values="reward")  # doctest: +SKIP
    """
    if not isinstance(topic, str):
        raise TypeError(f"metrics(): topic must be a string, not {type(topic).__name__}.")
    handle = cluster if cluster is not None else current_handle()
    if handle is not None and not handle.closed:
        # A finished map's reports are at the scheduler before its results reach the caller, but
        # the scheduler forwards them to this process on its own time: without the round trip a
        # metrics() right after map() can miss the last batches.
        attach(handle.client).sync()
    st = store(topic)
    rows = st.rows()
    try:
        import pandas as pd
    except ImportError:
        return rows
    df = pd.DataFrame(rows, columns=_columns(rows))
    df["time"] = pd.to_datetime(df["time"], unit="s", utc=True)
    df.attrs["topic"] = topic
    df.attrs["dropped"] = st.dropped
    df.attrs["evicted"] = st.evicted
    return df


def _columns(rows: Iterable[dict]) -> list[str]:
    cols: dict[str, None] = {"step": None, "time": None, "worker": None}
    for r in rows:
        for k in r:
            cols.setdefault(k, None)
    return list(cols)
