"""A ``Pool`` map's chunk on a worker (issue 36): what a 10^6-item map's workers paid per item.

- A chunk of quick items calls the pool's function directly once in slices
  (``_PoolTask.direct_call``): each item went through the task's Python
  ``__call__`` (3.6x a trivial function's own cost, 70 % of the workers' CPU).
  Before its initializer has run in the process, the per-item calls run it.
- A lease's chunk comes back packed by ``run_chunk(packed=True)``: the plain
  pickle of the result is also the check that every value can be sent back
  (the type scan of every value cost as much as unpickling the items); a value
  plain pickle refuses still becomes that item's ``MaybeEncodingError``.

``run_chunk`` runs here in-process (no Dask needed).
"""

from __future__ import annotations

import cloudpickle

from jupyter_cluster.engine.protocol import ChunkResult, MapRun, PackedResult, pack, unpack
from jupyter_cluster.engine.worker import run as worker_run
from jupyter_cluster.pool import worker as pool_worker


def inc(x):
    return x + 1


class CountingTask(pool_worker._PoolTask):
    """A pool's task that counts its own per-item calls."""

    __slots__ = ()
    calls = 0

    def __call__(self, *args, **kwargs):
        CountingTask.calls += 1
        return super().__call__(*args, **kwargs)

    def __reduce__(self):
        return (CountingTask, (self.func, self.pool_id, self.initializer, self.initargs, self.star))


def set_offset(k):
    global OFFSET
    OFFSET = k


def _run(task, items, name, packed=False):
    run = MapRun(f"pool-chunk-{name}", cloudpickle.dumps(task), False, 0, None, True)
    return worker_run.run_chunk(run, items, packed=packed)


def test_a_pool_chunk_of_quick_items_calls_the_function_not_the_task_per_item():
    CountingTask.calls = 0
    items = list(range(50_000))
    result = ChunkResult._make(_run(CountingTask(inc, "pool-direct", None, (), False), items, "direct"))
    assert result.values == [x + 1 for x in items]
    assert CountingTask.calls < 100, CountingTask.calls  # the first items only (before: one per item)


def test_a_starred_pool_chunk_and_one_with_an_initializer_keep_their_meaning():
    pairs = [(x, 2) for x in range(5_000)]
    starred = ChunkResult._make(_run(pool_worker._PoolTask(pow, "pool-star", None, (), True), pairs, "star"))
    assert starred.values == [x**2 for x, _ in pairs]
    task = pool_worker._PoolTask(inc, "pool-init", set_offset, (7,), False)
    assert task.direct_call() is None  # not yet: the per-item calls run the initializer first
    values = ChunkResult._make(_run(task, list(range(5_000)), "init")).values
    assert values == [x + 1 for x in range(5_000)]
    assert "pool-init" in pool_worker._initialized


def test_a_leases_chunk_comes_back_packed_and_an_unsendable_value_is_still_its_items_error():
    items = list(range(1_000))
    packed = _run(pool_worker._PoolTask(inc, "pool-packed", None, (), False), items, "packed", packed=True)
    assert isinstance(packed, PackedResult)
    assert ChunkResult._make(unpack(packed.data)).values == [x + 1 for x in items]

    def closure_at_700(x):  # a local function cannot be sent back by a multiprocessing pool
        return (lambda: x) if x == 700 else x

    checked = _run(pool_worker._PoolTask(closure_at_700, "pool-bad", None, (), False), items, "bad", packed=True)
    assert not isinstance(checked, PackedResult)  # checked value by value; the handler packs it
    result = ChunkResult._make(unpack(pack(checked)))
    assert result.values[699] == 699 and result.values[700] is None
    assert set(result.errors) == {700}
    assert result.errors[700][1] == "MaybeEncodingError", result.errors[700][1]
