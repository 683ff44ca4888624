"""The offline planner: known optima, method choice, its helpers against brute force."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from outcore.plan.lower import lower
from outcore.policies.baseline import liveness, offload_all
from outcore.pool import (
    Block,
    PoolError,
    blocks_from_schedule,
    place,
    plan_offsets,
    planned_placement,
)
from outcore.pool.planner import _event_order, greedy_by_size, overlapping_pairs, sweep
from outcore.pool.synthetic import random_blocks
from outcore.pool.timeindex import TimeIndex

from pool_graphs import residual_net, training_graph

KB = 1024


@pytest.mark.parametrize("name, blocks, optimum", [
    ("disjoint in time share one slot",
     [Block(0, 4 * KB, 0, 1), Block(1, 4 * KB, 2, 3), Block(2, 4 * KB, 4, 5)], 4 * KB),
    ("all live together stack",
     [Block(0, KB, 0, 3), Block(1, 2 * KB, 0, 3), Block(2, 3 * KB, 0, 3)], 6 * KB),
    ("a staircase fits the peak",
     [Block(0, 4 * KB, 0, 1), Block(1, 2 * KB, 1, 2), Block(2, 4 * KB, 2, 3),
      Block(3, 2 * KB, 3, 4)],
     6 * KB),
    ("best fit's trap (Dymem Fig. 7 shape)",
     [Block(0, 2 * KB, 0, 0), Block(1, KB, 0, 2), Block(2, 3 * KB, 0, 0), Block(3, KB, 0, 2),
      Block(4, 4 * KB, 1, 2)], 7 * KB),
])
def test_planner_reaches_the_optimum(name, blocks, optimum):
    placement = planned_placement(blocks)
    assert placement.pool_size == optimum == placement.lower_bound, name


def test_whole_step_blocks_are_stacked_at_the_bottom():
    blocks = [Block(0, KB, 3, 4), Block(1, 2 * KB, 0, 9), Block(2, 4 * KB, 0, 9),
              Block(3, KB, 5, 9)]
    offsets, _, _ = plan_offsets(blocks)
    assert (offsets[1], offsets[2]) == (0, 2 * KB)
    assert min(offsets[0], offsets[3]) >= 6 * KB


@pytest.mark.parametrize("method", ["auto", "size", "sweep"])
def test_methods_give_valid_placements_and_auto_is_the_best(method):
    blocks = random_blocks(300, seed=3)
    placement = planned_placement(blocks, method=method)
    assert placement.pool_size >= placement.lower_bound
    auto = planned_placement(blocks)
    assert auto.pool_size <= placement.pool_size


def test_large_inputs_skip_the_greedy_placement():
    blocks = random_blocks(400, seed=1)
    assert overlapping_pairs(blocks) > 10
    _, _, used = plan_offsets(blocks, pair_budget=10)
    assert used == "sweep-low"
    _, _, used = plan_offsets(blocks)
    assert used in ("size", "size-start", "size-class", "sweep-low", "sweep-death")


def test_planner_beats_the_online_pools_on_training_graphs():
    for policy in (liveness, offload_all):
        graph = training_graph(residual_net(4, width=3000))
        blocks = blocks_from_schedule(graph, lower(graph, policy(graph)))
        planned = place(blocks)
        for online in ("heap", "best-fit", "gtbm"):
            assert planned.pool_size <= place(blocks, online).pool_size, (policy.__name__, online)
        assert planned.ratio < 1.01


def test_bad_method_and_granularity():
    with pytest.raises(PoolError, match="unknown planner method 'magic'"):
        plan_offsets([Block(0, 1, 0, 0)], method="magic")  # type: ignore[arg-type]
    with pytest.raises(PoolError, match="granularity"):
        plan_offsets([Block(0, 1, 0, 0)], granularity=0)
    with pytest.raises(PoolError, match="block id 0 appears twice"):
        plan_offsets([Block(0, 1, 0, 0), Block(0, 2, 1, 1)])


def test_sweep_low_makes_best_fit_decisions():
    from outcore.pool import BestFitPool, run_online

    blocks = random_blocks(500, seed=7)
    sizes = {b.id: -(-b.size // 512) * 512 for b in blocks}
    assert sweep(blocks, sizes, "low") == run_online(BestFitPool(), blocks).offsets
    assert greedy_by_size([], {}) == {} and sweep([], {}) == {}


intervals = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 15)), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(intervals, st.integers(0, 40), st.integers(0, 15))
def test_time_index_finds_exactly_the_overlapping_items(spans, q_start, q_len):
    index = TimeIndex(60)
    for item, (start, length) in enumerate(spans):
        index.add(item, start, start + length)
    q_end = q_start + q_len
    expected = {i for i, (s, n) in enumerate(spans) if s <= q_end and q_start <= s + n}
    assert index.overlapping(q_start, q_end) == expected


@settings(max_examples=40, deadline=None)
@given(intervals)
def test_overlapping_pairs_counts_like_brute_force(spans):
    blocks = [Block(i, 1, s, s + n) for i, (s, n) in enumerate(spans)]
    brute = sum(1 for a in blocks for b in blocks if a.id < b.id and a.overlaps_in_time(b))
    assert overlapping_pairs(blocks) == brute


def test_huge_step_numbers_sort_like_small_ones():
    small = [Block(0, KB, 0, 5), Block(1, 2 * KB, 2, 3), Block(2, KB, 4, 9)]
    shift = 1 << 60  # int64 keys would overflow: the Python-int path is taken
    huge = [Block(b.id, b.size, b.start + shift, b.end + shift) for b in small]
    assert _event_order(huge) == _event_order(small) == [1, 3, 2, 5, 0, 4]
    sizes = {b.id: b.size for b in small}
    assert sweep(huge, sizes) == sweep(small, sizes)
