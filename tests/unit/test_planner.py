"""The batch planner without Dask: probes, budgets, guided tail, remembered durations."""

from __future__ import annotations

import functools

from jupyter_cluster.cell.function import CellFunction
from jupyter_cluster.engine import planner


def test_probes_carry_many_small_items_few_large_ones_and_a_short_budget():
    assert planner.probe_items(8) == planner.PROBE_ITEMS
    assert planner.probe_items(64 * 1024) == 4
    assert planner.probe_items(10**9) == 1
    size, budget = planner.next_size(remaining=None, per_item=None, spread=4, probe=256)
    assert (size, budget) == (256, planner.PROBE_BUDGET_SECONDS)
    # A short known input is not all put in the first probe.
    assert planner.next_size(remaining=40, per_item=None, spread=4, probe=256)[0] == 10


def test_known_durations_aim_at_the_target_with_a_proportional_budget():
    size, budget = planner.next_size(remaining=None, per_item=0.001, spread=4, probe=1)
    assert size == round(planner.TARGET_TASK_SECONDS / 0.001)
    assert budget == planner.BUDGET_FACTOR * 0.001 * size
    # Long items: one per batch, and the budget never below the target.
    assert planner.next_size(remaining=None, per_item=5.0, spread=4, probe=1) == (1, 10.0)
    # Tiny items: capped.
    assert planner.next_size(remaining=None, per_item=1e-9, spread=4, probe=1)[0] == planner.MAX_CHUNK_ITEMS


def test_the_tail_is_spread_over_the_batches_and_never_below_the_floor():
    # 512 rollouts of 50 ms over 256 leases: 2 each (one batch per lease, the scale_sim case).
    assert planner.next_size(remaining=512, per_item=0.05, spread=256, probe=1)[0] == 2
    # Guided self-scheduling: the batches shrink as the input runs out...
    sizes = []
    remaining = 1000
    while remaining:
        n, _ = planner.next_size(remaining=remaining, per_item=0.0001, spread=8, probe=1)
        sizes.append(n)
        remaining -= n
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] >= 1 and sum(sizes) == 1000
    # ...but not below MIN_TASK_SECONDS of work each.
    assert min(sizes) >= min(round(planner.MIN_TASK_SECONDS / 0.0001), sizes[-1])
    assert planner.next_size(remaining=3, per_item=0.0001, spread=8, probe=1)[0] == 3


def test_many_leases_get_batches_the_client_can_keep_up_with():
    # Few leases: the usual 0.2 s batches and 10 ms tail.
    assert planner.batch_seconds(2) == (planner.TARGET_TASK_SECONDS, planner.MIN_TASK_SECONDS)
    # 256 leases at 500 batches a second: about 0.5 s batches, a tail of at least 0.128 s.
    target, floor = planner.batch_seconds(256)
    assert target == 256 / planner.CLIENT_BATCHES_PER_SECOND and floor == target / 4
    # 16 rollouts of 50 ms per lease: 10-item batches instead of 4, and a tail of 3 items, not 1.
    assert planner.next_size(remaining=4096, per_item=0.05, spread=256, probe=1, target=target, floor=floor)[0] == 10
    assert planner.next_size(remaining=300, per_item=0.05, spread=512, probe=1, target=target, floor=floor)[0] == 3
    assert planner.next_size(remaining=4096, per_item=0.05, spread=256, probe=1)[0] == 4


def test_remembered_durations_are_keyed_by_code_and_bounded():
    def f(x):
        return x

    def g(x):
        return x

    mem = planner.Remembered(limit=2)
    mem.put(planner.duration_key(f), 0.5)
    assert mem.get(planner.duration_key(f)) == 0.5
    assert mem.get(planner.duration_key(functools.partial(f, 1))) == 0.5  # same code
    assert mem.get(planner.duration_key(g)) is None
    cell = CellFunction("y = x * 2", targets="x")
    mem.put(planner.duration_key(cell), 0.1)
    assert mem.get(planner.duration_key(CellFunction("y = x * 2", targets="x"))) == 0.1
    mem.put(planner.duration_key(g), 0.2)  # a third key pushes out the oldest
    assert mem.get(planner.duration_key(f)) is None and mem.get(planner.duration_key(g)) == 0.2
    assert planner.duration_key(object()) is None


def test_a_sized_input_gets_batches_ten_times_larger_than_a_stream():
    """Issue 36: 10^6 no-ops in batches of at most 10,000 were 100 round trips of ~1 ms of work."""
    assert planner.next_size(remaining=10**6, per_item=1e-8, spread=4, probe=1)[0] == planner.MAX_SIZED_CHUNK_ITEMS
    assert planner.MAX_SIZED_CHUNK_ITEMS >= 10 * planner.MAX_CHUNK_ITEMS
    assert planner.next_size(remaining=None, per_item=1e-8, spread=4, probe=1)[0] == planner.MAX_CHUNK_ITEMS
