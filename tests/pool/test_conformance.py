"""``jupyter_cluster.Pool`` against ``multiprocessing.Pool``: same calls, same outcomes.

Every scenario runs on a real ``multiprocessing`` pool (fork, 2 processes) and
on our pool over a real 2-worker Dask cluster; the outcomes (values, or the
exception's exact class) must be equal.  Functions live at module level so
that multiprocessing can pickle them by reference.
"""

from __future__ import annotations

import gc
import itertools
import multiprocessing
import os
import pickle
import re
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest

import jupyter_cluster as jc
from jupyter_cluster.engine.direct import pool_for

from ..conftest import wait_for

MP = multiprocessing.get_context("fork")


# -- functions the pools run ----------------------------------------------------------


class CustomError(Exception):
    pass


def sq(x):
    return x * x


def inv(x):
    return 1 / x


def add(a, b=0):
    return a + b


def echo(*args, **kwargs):
    return args, kwargs


def raise_(cls, msg):
    raise cls(msg)


def delayed(i, n=6, step=0.06):
    """Later items finish first: ordering must not follow completion."""
    time.sleep((n - i) * step)
    return i


def sleep_return(seconds, value=None):
    time.sleep(seconds)
    return value


def interval(i):
    start = time.time()
    time.sleep(0.15)
    return (start, time.time())


_STATE: dict = {}


def init_state(flag):
    _STATE[flag] = _STATE.get(flag, 0) + 1


def read_state(flag):
    time.sleep(0.01)
    return (os.getpid(), _STATE.get(flag))


# -- pools ------------------------------------------------------------------------------


def mp_pool(processes=2, *args, **kwargs):
    return MP.Pool(processes, *args, **kwargs)


def jc_pool(processes=None, *args, **kwargs):
    return jc.Pool(processes, *args, **kwargs)


FACTORIES = {"multiprocessing": mp_pool, "jupyter_cluster": jc_pool}


@pytest.fixture(scope="module")
def shared_pools(cluster):
    pools = {name: make() for name, make in FACTORIES.items()}
    yield pools
    for p in pools.values():
        p.terminate()
        p.join()


@pytest.fixture
def fresh(cluster):
    """Make pools for one test; all are terminated afterwards."""
    made = []

    def make(kind, *args, **kwargs):
        p = FACTORIES[kind](*args, **kwargs)
        made.append(p)
        return p

    yield make
    for p in made:
        p.terminate()


def outcome(fn, *args):
    """("ok", value) or ("raise", exception class, message for our own ValueErrors)."""
    try:
        return ("ok", fn(*args))
    except Exception as exc:
        # ValueError messages are part of the contract ("Pool not running");
        # object reprs inside them are not.
        message = re.sub(r"<[^>]*>", "<obj>", str(exc)) if type(exc) is ValueError else None
        return ("raise", type(exc), message)


def compare(run, *factory_args, pools=None, fresh=None, **factory_kwargs):
    results = {}
    for kind in FACTORIES:
        if pools is not None:
            results[kind] = outcome(run, pools[kind])
        else:
            results[kind] = outcome(lambda kind=kind: run(fresh(kind, *factory_args, **factory_kwargs)))
    assert results["jupyter_cluster"] == results["multiprocessing"], results
    return results["multiprocessing"]


# -- scenarios on a running pool ------------------------------------------------------------


def _imap_with_errors(p):
    it = p.imap(inv, [1, 0, 2, 0, 4])
    out = []
    for _ in range(5):
        try:
            out.append(next(it))
        except ZeroDivisionError:
            out.append("ZeroDivisionError")
    out.append(list(it))
    return out


def _map_async_callback(p):
    seen = []
    r = p.map_async(sq, range(6), callback=seen.append)
    value = r.get(timeout=60)
    return value, seen, r.ready(), r.successful()


def _map_async_error_callback(p):
    seen = []
    r = p.map_async(inv, [1, 0], error_callback=lambda e: seen.append(type(e)))
    r.wait(60)
    return r.ready(), r.successful(), seen


def _apply_async_states(p):
    r = p.apply_async(sleep_return, (0.8, "x"))
    early = (r.ready(), outcome(r.successful))
    timed_out = outcome(r.get, 0.05)
    r.wait(0.01)
    return early, timed_out, r.get(timeout=60), r.ready(), r.successful()


def _imap_next_timeout(p):
    it = p.imap(sleep_return, [0.8, 0.0])
    first = outcome(it.next, 0.05)
    return first, it.next(timeout=60), it.next(timeout=60), outcome(it.next, 60)


SCENARIOS = {
    "apply": lambda p: p.apply(pow, (2, 10)),
    "apply_kwds": lambda p: p.apply(echo, (1, (2, 3)), {"key": "k", "workers": [2], "pure": 1}),
    "apply_tuple_with_callable": lambda p: p.apply(echo, ((len, [1, 2]),)),
    "apply_builtin_error": lambda p: p.apply(raise_, (KeyError, "k")),
    "apply_custom_error": lambda p: p.apply(raise_, (CustomError, "c")),
    "apply_not_callable": lambda p: p.apply(5),
    "apply_async_get": lambda p: p.apply_async(add, (1,), {"b": 2}).get(timeout=60),
    "apply_async_states": _apply_async_states,
    "map": lambda p: p.map(sq, range(40)),
    "map_chunksize_1": lambda p: p.map(sq, range(15), chunksize=1),
    "map_chunksize_7": lambda p: p.map(sq, range(15), 7),
    "map_generator": lambda p: p.map(sq, (i for i in range(10))),
    "map_empty": lambda p: p.map(sq, []),
    "map_error": lambda p: p.map(inv, [1, 0, 2]),
    "map_custom_error": lambda p: p.map(raise_, [CustomError]),
    "map_async": lambda p: p.map_async(sq, range(10)).get(timeout=60),
    "map_async_error": lambda p: p.map_async(inv, [0]).get(timeout=60),
    "map_async_callback": _map_async_callback,
    "map_async_error_callback": _map_async_error_callback,
    "starmap": lambda p: p.starmap(add, [(1, 2), (3, 4), (5,)]),
    "starmap_async": lambda p: p.starmap_async(add, [(1, 2), (3, 4)]).get(timeout=60),
    "starmap_error": lambda p: p.starmap(add, [(1, "a")]),
    "imap": lambda p: list(p.imap(sq, range(20))),
    "imap_chunksize_3": lambda p: list(p.imap(sq, range(20), chunksize=3)),
    "imap_order": lambda p: list(p.imap(delayed, range(6))),
    "imap_unordered": lambda p: sorted(p.imap_unordered(sq, range(20))),
    "imap_unordered_chunksize_3": lambda p: sorted(p.imap_unordered(sq, range(20), 3)),
    "imap_errors_in_place": _imap_with_errors,
    "imap_next_timeout": _imap_next_timeout,
    "imap_chunksize_0": lambda p: p.imap(sq, [1], chunksize=0),
    "imap_unordered_chunksize_0": lambda p: p.imap_unordered(sq, [1], chunksize=0),
    "pickle_pool": lambda p: pickle.dumps(p),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_same_as_multiprocessing(shared_pools, name):
    compare(SCENARIOS[name], pools=shared_pools)


# -- lifecycle scenarios (fresh pools) ----------------------------------------------------------


METHOD_CALLS = {
    "apply": lambda p: p.apply(sq, (1,)),
    "apply_async": lambda p: p.apply_async(sq, (1,)),
    "map": lambda p: p.map(sq, [1]),
    "map_async": lambda p: p.map_async(sq, [1]),
    "imap": lambda p: p.imap(sq, [1]),
    "imap_unordered": lambda p: p.imap_unordered(sq, [1]),
    "starmap": lambda p: p.starmap(add, [(1, 2)]),
    "starmap_async": lambda p: p.starmap_async(add, [(1, 2)]),
}


def _after_close(p):
    p.close()
    errors = {name: outcome(call, p) for name, call in METHOD_CALLS.items()}
    p.join()
    return errors


def _after_terminate(p):
    p.terminate()
    errors = {name: outcome(call, p) for name, call in METHOD_CALLS.items()}
    p.join()
    return errors


def _close_join_completes_work(p):
    results = [p.apply_async(sleep_return, (0.05 * (i % 3), i)) for i in range(6)]
    mapped = p.map_async(sq, range(8))
    p.close()
    p.join()
    return [r.ready() for r in results], [r.get(0) for r in results], mapped.get(0)


def _context_manager(p):
    with p as q:
        assert q is p
        value = q.map(sq, range(4))
    return value, outcome(p.map, sq, [1])


def _join_while_running(p):
    return outcome(p.join)


@pytest.mark.parametrize(
    "run",
    [_after_close, _after_terminate, _close_join_completes_work, _context_manager, _join_while_running],
    ids=lambda f: f.__name__.strip("_"),
)
def test_lifecycle_same_as_multiprocessing(fresh, run):
    compare(run, fresh=fresh)


def test_closed_pool_message(fresh):
    p = fresh("jupyter_cluster")
    p.close()
    with pytest.raises(ValueError, match="^Pool not running$"):
        p.map(sq, [1])
    p.join()


@pytest.mark.parametrize(
    "args, kwargs",
    [((0,), {}), ((-3,), {}), ((2, 5), {}), ((2,), {"maxtasksperchild": 0}), ((2,), {"maxtasksperchild": -1})],
    ids=["zero", "negative", "initializer_not_callable", "maxtasks_zero", "maxtasks_negative"],
)
def test_constructor_validation_same_as_multiprocessing(cluster, args, kwargs):
    results = {}
    for kind, make in FACTORIES.items():
        results[kind] = outcome(lambda make=make: make(*args, **kwargs).terminate())
    assert results["jupyter_cluster"][:2] == results["multiprocessing"][:2], results
    assert results["multiprocessing"][0] == "raise"


def test_result_types_subscript_as_in_multiprocessing():
    # multiprocessing.pool.ApplyResult[int] is a types.GenericAlias (annotations, isinstance on the origin)
    import multiprocessing.pool as mp_pool

    from jupyter_cluster import pool as jc_pool

    for ours, theirs in ((jc_pool.ApplyResult, mp_pool.ApplyResult), (jc_pool.MapResult, mp_pool.MapResult)):
        alias, reference = ours[int], theirs[int]
        assert type(alias) is type(reference)
        assert (alias.__origin__, alias.__args__) == (ours, (int,))


def test_maxtasksperchild_accepted(fresh):
    p = fresh("jupyter_cluster", 2, None, (), 3)
    assert p.map(sq, range(5)) == [0, 1, 4, 9, 16]


def test_initializer_runs_once_per_process(fresh):
    outcomes = {}
    for kind in FACTORIES:
        flag = f"{kind}-{uuid.uuid4().hex}"
        p = fresh(kind, 2, init_state, (flag,))
        rows = p.map(read_state, [flag] * 24, chunksize=1)
        pids = {pid for pid, _ in rows}
        assert os.getpid() not in pids
        outcomes[kind] = sorted({count for _, count in rows})
    # every task saw the initializer's effect, and it ran once in each process
    assert outcomes["jupyter_cluster"] == outcomes["multiprocessing"] == [1]


def test_processes_caps_concurrency(fresh):
    for kind in FACTORIES:
        p = fresh(kind, 1)
        spans = sorted(p.map(interval, range(4), chunksize=1))
        overlaps = [b[0] < a[1] - 0.01 for a, b in zip(spans, spans[1:])]
        assert not any(overlaps), (kind, spans)
        spans = sorted(r.get(60) for r in [p.apply_async(interval, (i,)) for i in range(3)])
        assert not any(b[0] < a[1] - 0.01 for a, b in zip(spans, spans[1:])), (kind, spans)


def test_two_maps_of_a_pool_at_once_each_finish_without_waiting_for_idle_leases(fresh):
    """The second map's leases can end (yield) while the first map's go idle: it takes those up.

    It used to count them against the workers' threads without using them, and
    waited until they ended (``engine.linger``, 60 s) in about half the rounds.
    """
    p = fresh("jupyter_cluster")
    for _ in range(8):
        t0 = time.monotonic()
        first = p.map_async(sq, [1, 2])
        second = p.starmap_async(add, [(1, 2)])
        assert first.get(30) == [1, 4]
        assert second.get(30) == [3]
        took = time.monotonic() - t0
        assert took < 10, f"two small maps took {took:.1f} s"


def test_callbacks_run_in_caller_process_on_a_result_thread(fresh):
    for kind in FACTORIES:
        p = fresh(kind)
        seen = []

        def cb(value, tag, seen=seen):
            seen.append(
                (
                    tag,
                    value if tag != "err" else type(value),
                    os.getpid(),
                    threading.current_thread() is threading.main_thread(),
                )
            )

        r1 = p.apply_async(sq, (3,), callback=lambda v: cb(v, "apply"))
        r2 = p.apply_async(inv, (0,), error_callback=lambda e: cb(e, "err"))
        r3 = p.map_async(sq, [1, 2], callback=lambda v: cb(v, "map"))
        r4 = p.starmap_async(add, [(1, 2)], callback=lambda v: cb(v, "starmap"))
        for r in (r1, r2, r3, r4):
            r.wait(60)
        # callbacks run before the result is ready, as in multiprocessing
        assert sorted(seen, key=str) == sorted(
            [
                ("apply", 9, os.getpid(), False),
                ("err", ZeroDivisionError, os.getpid(), False),
                ("map", [1, 4], os.getpid(), False),
                ("starmap", [3], os.getpid(), False),
            ],
            key=str,
        ), kind


def test_imap_is_lazy_over_an_infinite_generator(fresh):
    for kind in FACTORIES:
        p = fresh(kind)
        consumed = itertools.count()

        def numbers(consumed=consumed):
            for i in itertools.count():
                next(consumed)
                yield i

        first = list(itertools.islice(p.imap(sq, numbers()), 30))
        assert first == [i * i for i in range(30)]
        if kind == "multiprocessing":
            # Its task thread now reads the generator for ever and serves no
            # other call: stop it.
            p.terminate()
            continue
        # Only a bounded number of items is read ahead of the results taken.
        read = next(consumed)
        assert read < 100, read
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:  # observe: reading must have stopped
            time.sleep(0.05)
        assert next(consumed) == read + 1
        unordered = list(itertools.islice(p.imap_unordered(sq, numbers()), 10))
        assert len(unordered) == 10 and all(isinstance(v, int) for v in unordered)


# -- our pool only ------------------------------------------------------------------------


def test_lambdas_and_notebook_functions(fresh):
    p = fresh("jupyter_cluster")
    assert p.map(lambda x: x + 1, range(3)) == [1, 2, 3]
    assert p.apply(lambda: "hi") == "hi"
    # A function defined in a notebook: its module is __main__, so it travels by value.
    ns = {"__name__": "__main__"}
    exec(
        textwrap.dedent(
            """
            OFFSET = 100
            def helper(x):
                return x + OFFSET
            def work(x):
                return helper(x) * 2
            """
        ),
        ns,
    )
    assert p.map(ns["work"], [1, 2]) == [202, 204]
    assert sorted(p.imap_unordered(ns["work"], [3])) == [206]


def test_initializer_globals_visible_to_notebook_functions(fresh, cluster):
    """The classic pattern: the initializer loads a model into a global, tasks use it."""
    ns = {"__name__": "__main__"}
    exec(
        textwrap.dedent(
            """
            import os
            model = None          # exists in the notebook too, as it often does
            def load(scale):
                global model
                model = {"scale": scale, "pid": os.getpid()}
            def predict(x):
                return x * model["scale"], model["pid"] == os.getpid()
            """
        ),
        ns,
    )
    p = fresh("jupyter_cluster", None, ns["load"], (10,))
    assert p.map(ns["predict"], range(6), chunksize=1) == [(x * 10, True) for x in range(6)]
    assert p.apply(ns["predict"], (7,)) == (70, True)

    def held(pool_id):
        from jupyter_cluster.pool import worker

        return pool_id in worker._namespaces

    assert any(cluster.client.run(held, p._id).values())
    p.close()
    p.join()
    # As multiprocessing frees its processes, the pool's globals are released on the workers.
    wait_for(lambda: not any(cluster.client.run(held, p._id).values()), timeout=30, message="pool globals released")


def test_error_names_the_item_and_keeps_type(fresh):
    p = fresh("jupyter_cluster")
    with pytest.raises(ZeroDivisionError) as info:
        p.map(inv, [1, 2, 0, 4], chunksize=1)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "item 2" in notes and "inv" in notes


def test_prints_in_tasks_show_in_the_caller(fresh, capsys):
    p = fresh("jupyter_cluster")
    p.map(print, ["printed on a worker"])
    assert "printed on a worker" in capsys.readouterr().out


def test_join_waits_for_apply_queue_behind_cap(fresh):
    p = fresh("jupyter_cluster", 1)
    results = [p.apply_async(sleep_return, (0.05, i)) for i in range(5)]
    p.close()
    p.join(timeout=60)
    assert [r.get(0) for r in results] == list(range(5))


def test_terminate_cancels_running_work(fresh, cluster):
    p = fresh("jupyter_cluster")
    r = p.apply_async(sleep_return, (10, 1))
    job = p.map_async(sleep_return, [10, 10])
    wait_for(lambda: cluster.client.processing() and any(cluster.client.processing().values()), timeout=30)
    t0 = time.monotonic()
    p.terminate()
    p.join()
    assert time.monotonic() - t0 < 5
    client = cluster.client

    def left():
        # Leases idle between maps (the client's, kept engine.linger for its next map, yielding to
        # any task that needs their thread) are no work of the pool.
        idle = {ls.future.key for leases in pool_for(client).idle.values() for ls in leases}
        return [k for keys in client.processing().values() for k in keys if k not in idle]

    deadline = time.monotonic() + 20
    while left() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left(), client.processing()
    assert not r.ready() and not job.ready()  # as multiprocessing: unfinished results stay unfinished


def test_pool_starts_default_cluster_when_none(tmp_path):
    script = textwrap.dedent(
        """
        import jupyter_cluster as jc
        if __name__ == "__main__":
            with jc.Pool() as pool:
                print("RESULT", pool.map(abs, [-1, -2]), pool._processes)
            jc.stop()
        """
    )
    env = dict(os.environ, DASK_JUPYTER_CLUSTER__LOCAL__WORKERS="1")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert "RESULT [1, 2] 1" in out.stdout
    assert "Started cluster" in out.stdout  # announced in one line


def test_pool_in_a_real_ipython_shell(ip, cluster):
    """Cells as a user writes them: functions and the initializer defined in the notebook."""
    result = ip.run_cell(
        textwrap.dedent(
            """
            import jupyter_cluster as jc
            threshold = 3
            def setup(offset):
                global table
                table = {i: i + offset for i in range(10)}
            def lookup(i):
                return table[i] if i < threshold else -1
            with jc.Pool(initializer=setup, initargs=(100,)) as pool:
                pool_out = pool.map(lookup, range(5))
                pool_lambda = pool.apply(lambda: threshold * 2)
            """
        )
    )
    result.raise_error()
    assert ip.user_ns["pool_out"] == [100, 101, 102, -1, -1]
    assert ip.user_ns["pool_lambda"] == 6


# -- issue 25: what CPython's own Pool tests found (tests/pool/test_cpython.py runs those) -----------


def mark_and_sleep(path, seconds=300):
    open(path, "w").close()
    time.sleep(seconds)  # a C call: an exception raised in its thread waits until it returns
    return path


def test_terminate_frees_threads_blocked_in_a_c_call(fresh, cluster, tmp_path):
    """multiprocessing ends its processes; ours gives Dask the threads of running items back at once."""
    p = fresh("jupyter_cluster", 2)
    marks = [str(tmp_path / f"map-{i}") for i in range(10)] + [str(tmp_path / "apply")]
    applied = p.apply_async(mark_and_sleep, (marks[-1],))
    mapped = p.map_async(mark_and_sleep, marks[:-1], chunksize=1)
    # The cluster has 2 threads: two marks mean both are in time.sleep(300).
    wait_for(lambda: sum(map(os.path.exists, marks)) >= 2, timeout=60, message="both threads to be sleeping")
    p.terminate()
    p.join()
    with jc.Pool(1) as q:  # needs a free thread: before the fix it waited for the 300 s sleeps
        assert q.apply_async(sq, (3,)).get(timeout=60) == 9
        assert q.map_async(sq, range(4)).get(timeout=60) == [0, 1, 4, 9]
    assert sum(map(os.path.exists, marks)) == 2  # the rest of the map never started
    assert not applied.ready() and not mapped.ready()  # as multiprocessing: unfinished results stay unfinished


def _remote_cause(call):
    def run(p):
        try:
            call(p)
        except CustomError as exc:
            cause = exc.__cause__
            return type(cause).__name__, "raise CustomError(msg)  # the remote line" in getattr(cause, "tb", "")
        return None

    return run


def custom_fail(msg):
    raise CustomError(msg)  # the remote line


@pytest.mark.parametrize(
    "call",
    [
        lambda p: p.apply(custom_fail, ("c",)),
        lambda p: p.map(custom_fail, ["c"], chunksize=1),
        lambda p: p.map_async(custom_fail, ["c"]).get(timeout=60),
        lambda p: list(p.imap(custom_fail, ["c"])),
    ],
    ids=["apply", "map", "map_async", "imap"],
)
def test_remote_traceback_is_the_cause_as_in_multiprocessing(shared_pools, call):
    """Code written for multiprocessing reads the worker's traceback from ``exc.__cause__.tb``."""
    assert compare(_remote_cause(call), pools=shared_pools) == ("ok", ("RemoteTraceback", True))


def test_failed_map_raises_after_every_item_ran(fresh, tmp_path):
    """As multiprocessing's map (no fail-fast): nothing of the map still runs when it raises."""
    marks = [str(tmp_path / f"done-{i}") for i in range(4)]
    for kind in FACTORIES:
        for m in marks:
            if os.path.exists(m):
                os.remove(m)
        p = fresh(kind, 2)
        with pytest.raises(ZeroDivisionError):
            p.map(_fail_first_then_mark, list(zip(range(4), marks)), chunksize=1)
        assert all(map(os.path.exists, marks[1:])), kind


def _fail_first_then_mark(arg):
    i, path = arg
    if i == 0:
        return 1 / 0
    time.sleep(0.3)
    open(path, "w").close()


def test_results_of_notebook_code_still_come_back(ip, cluster):
    """MaybeEncodingError is for what pickle cannot send (as multiprocessing); the notebook's own code travels."""
    result = ip.run_cell(
        textwrap.dedent(
            """
            import jupyter_cluster as jc
            class Point:
                def __init__(self, x):
                    self.x = x
            with jc.Pool() as pool:
                nb_point = pool.apply(lambda: Point(4))
                nb_fn = pool.apply(lambda: (lambda: 5))
            """
        )
    )
    result.raise_error()
    assert ip.user_ns["nb_point"].x == 4
    assert ip.user_ns["nb_fn"]() == 5


@pytest.mark.parametrize(
    "call",
    [
        lambda p: p.apply(_returns_a_local_function),
        lambda p: p.map(_returns_a_local_function, [1, 2], chunksize=1),
        lambda p: p.map_async(_returns_a_local_function, [1]).get(timeout=60),
        lambda p: next(p.imap(_returns_a_local_function, [1])),
    ],
    ids=["apply", "map", "map_async", "imap"],
)
def test_unsendable_result_is_maybe_encoding_error_as_in_multiprocessing(shared_pools, call):
    from multiprocessing.pool import MaybeEncodingError

    def run(p):
        try:
            call(p)
        except MaybeEncodingError as exc:
            return "MaybeEncodingError", "<lambda>" in exc.value
        return "returned"

    assert compare(run, pools=shared_pools) == ("ok", ("MaybeEncodingError", True))


def _returns_a_local_function(x=0):
    return lambda: x  # pickle cannot send it back (no name to import it by)


def test_dropped_running_pool_warns_as_in_multiprocessing(cluster):
    p = jc.Pool(1)
    assert p.apply(sq, (2,)) == 4
    with pytest.warns(ResourceWarning, match="^unclosed running multiprocessing pool <jupyter_cluster.Pool"):
        del p
        gc.collect()
