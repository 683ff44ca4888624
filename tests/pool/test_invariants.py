"""Invariants of every policy on random lifetimes and sizes (hypothesis), and the checker's
messages: a broken placement is reported with its step and both blocks."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from outcore.pool import (
    POLICIES,
    Block,
    PoolError,
    check_placement,
    live_curve,
    measure,
    place,
)

block_specs = st.lists(
    st.tuples(st.integers(1, 20_000), st.integers(0, 25), st.integers(0, 12),
              st.sampled_from(["static", "movable", "temporary", "reclaimed"])),
    min_size=1, max_size=35)


def _blocks(specs) -> list[Block]:
    return [Block(i, size, start, start + length, mobility)
            for i, (size, start, length, mobility) in enumerate(specs)]


@settings(max_examples=120, deadline=None)
@given(block_specs, st.sampled_from(sorted(POLICIES)))
def test_every_policy_places_every_block_without_overlap(specs, policy):
    blocks = _blocks(specs)
    placement = place(blocks, policy)
    check_placement(blocks, placement.offsets, placement.sizes, placement.pool_size)
    assert placement.pool_size >= placement.lower_bound
    assert placement.per_step_used == live_curve(blocks, placement.sizes)
    assert max(placement.per_step_used) <= placement.pool_size
    assert all(u <= f <= placement.pool_size
               for u, f in zip(placement.per_step_used, placement.per_step_footprint, strict=True))
    assert len(placement.uf) == len(blocks) and all(0.0 <= u <= 1.0 for u in placement.uf)
    assert all(placement.sizes[b.id] % 512 == 0 for b in blocks)


@settings(max_examples=60, deadline=None)
@given(block_specs, st.data())
def test_a_collision_is_reported_with_its_step_and_both_blocks(specs, data):
    blocks = _blocks(specs)
    placement = place(blocks)
    pairs = [(a, b) for a in blocks for b in blocks if a.id < b.id and a.overlaps_in_time(b)]
    if not pairs:
        return
    a, b = data.draw(st.sampled_from(pairs))
    offsets = dict(placement.offsets)
    offsets[b.id] = offsets[a.id]  # b now sits on a while both are live
    pool = max(offsets[i] + placement.sizes[i] for i in offsets)
    with pytest.raises(PoolError) as err:
        check_placement(blocks, offsets, placement.sizes, pool)
    found = re.match(r"step (\d+): block (\d+) at \[\d+, \d+\) overlaps block (\d+) at",
                     str(err.value))
    assert found, str(err.value)
    step, x, y = (int(g) for g in found.groups())
    assert b.id in (x, y)  # only b moved, so b is in every collision
    bx, by = blocks[x], blocks[y]
    assert bx.start <= step <= bx.end and by.start <= step <= by.end
    sizes = placement.sizes
    assert offsets[x] < offsets[y] + sizes[y] and offsets[y] < offsets[x] + sizes[x]


def test_checker_names_blocks_outside_the_pool_and_unplaced_ones():
    blocks = [Block(0, 1000, 0, 1, name="conv1"), Block(1, 1000, 1, 2, name="relu1")]
    outside = r"block 1 \(relu1\) at \[1000, 2024\) lies outside the pool of 2000 B"
    with pytest.raises(PoolError, match=outside):
        check_placement(blocks, {0: 0, 1: 1000}, {0: 1000, 1: 1024}, 2000)
    with pytest.raises(PoolError, match=r"block 1 \(relu1\) has no offset"):
        check_placement(blocks, {0: 0}, {0: 1024}, 4096)
    with pytest.raises(PoolError, match=r"step 1: block 1 \(relu1\) at \[512, 1536\) overlaps "
                                        r"block 0 \(conv1\) at \[0, 1024\)"):
        check_placement(blocks, {0: 0, 1: 512}, {0: 1024, 1: 1024}, 4096)


def test_uf_and_footprint_on_a_known_layout():
    # pool 10K: A [0,2K) lives 0-2, B [2K,4K) 0-0, C [4K,5K) 0-2; at step 1 D (3K) arrives.
    K = 1024
    blocks = [Block(0, 2 * K, 0, 2), Block(1, 2 * K, 0, 0), Block(2, K, 0, 2),
              Block(3, 3 * K, 1, 2)]
    offsets = {0: 0, 1: 2 * K, 2: 4 * K, 3: 5 * K}
    sizes = {0: 2 * K, 1: 2 * K, 2: K, 3: 3 * K}
    used, footprint, uf = measure(blocks, offsets, sizes, 10 * K)
    assert used == [5 * K, 6 * K, 6 * K]
    assert footprint == [5 * K, 8 * K, 8 * K]  # step 1: B's hole is free but below D
    # before A, B, C: the whole pool is one free piece; before D: 2K hole + 5K top, D needs 3K
    assert uf == [0.0, 0.0, 0.0, pytest.approx(2 / 7)]


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_no_blocks_need_no_pool(policy):
    placement = place([], policy)
    assert placement.pool_size == 0 and placement.offsets == {} and placement.ratio == 1.0
