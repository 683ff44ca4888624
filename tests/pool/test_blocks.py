"""Blocks, the event stream, the lower bound and the free list (tables with known answers)."""

from __future__ import annotations

import pytest

from outcore.pool import (
    Alloc,
    Block,
    PoolError,
    Release,
    event_stream,
    live_curve,
    lower_bound,
    round_up,
)
from outcore.pool.freelist import FreeList

KB = 1024


@pytest.mark.parametrize("kwargs, message", [
    ({"size": 0, "start": 0, "end": 1}, "size 0"),
    ({"size": -5, "start": 0, "end": 1}, "size -5"),
    ({"size": 8, "start": 3, "end": 2}, "[3, 2]"),
    ({"size": 8, "start": -1, "end": 2}, "[-1, 2]"),
    ({"size": 8, "start": 0, "end": 2, "mobility": "sticky"}, "'sticky'"),
])
def test_bad_blocks_are_refused_with_the_reason(kwargs, message):
    with pytest.raises(PoolError) as err:
        Block(id=7, **kwargs)
    assert message in str(err.value) and "block 7" in str(err.value)


@pytest.mark.parametrize("size, granularity, expected", [
    (1, 512, 512), (512, 512, 512), (513, 512, 1024), (1000, 1024, 1024), (4097, 1024, 5120),
])
def test_round_up(size, granularity, expected):
    assert round_up(size, granularity) == expected


def test_events_free_before_allocating_at_the_same_step():
    blocks = [Block(1, 10, 0, 1), Block(0, 20, 0, 0), Block(2, 30, 1, 2)]
    assert event_stream(blocks) == [
        Alloc(0, 0, 20, "movable"), Alloc(0, 1, 10, "movable"),
        Release(1, 0), Alloc(1, 2, 30, "movable"),
        Release(2, 1), Release(3, 2),
    ]


def test_live_curve_and_lower_bound():
    blocks = [Block(0, 100, 0, 2), Block(1, 50, 1, 1), Block(2, 70, 2, 3)]
    assert live_curve(blocks) == [100, 150, 170, 70]
    assert lower_bound(blocks) == 170
    assert live_curve(blocks, {0: 512, 1: 512, 2: 512}) == [512, 1024, 1024, 512]
    assert lower_bound([]) == 0


def test_freelist_coalesces_neighbours_but_not_across_a_barrier():
    free = FreeList(barriers=frozenset({8 * KB}))
    free.add(0, 2 * KB)
    free.add(4 * KB, 4 * KB)
    free.add(8 * KB, 2 * KB)
    free.add(2 * KB, 2 * KB)  # fills the hole: merges left and right, stops at the barrier
    assert free.segments() == [(0, 8 * KB), (8 * KB, 2 * KB)]
    assert free.total == 10 * KB and free.largest() == 8 * KB


def test_freelist_without_coalescing_keeps_pieces():
    free = FreeList(coalesce=False)
    free.add(0, KB)
    free.add(KB, KB)
    assert free.segments() == [(0, KB), (KB, KB)]
    assert free.first_fit(2 * KB) is None


def test_freelist_fits():
    free = FreeList()
    for start, size in [(0, 4 * KB), (5 * KB, 2 * KB), (8 * KB, 3 * KB)]:
        free.add(start, size)
    assert free.first_fit(2 * KB) == 0
    assert free.best_fit(2 * KB) == 5 * KB
    assert free.best_fit(3 * KB) == 8 * KB
    assert free.last_fit(2 * KB) == 8 * KB
    assert free.last_fit(4 * KB) == 0
    assert free.best_fit(5 * KB) is None
    assert free.bytes_below(3 * KB) == 2 * KB
    assert free.ending_at(7 * KB) == 5 * KB and free.ending_at(6 * KB) is None


def test_freelist_refuses_double_free_and_taking_used_bytes_unchanged():
    free = FreeList()
    free.add(0, 4 * KB)
    before = free.segments()
    with pytest.raises(PoolError, match="freed twice"):
        free.add(KB, KB)
    with pytest.raises(PoolError, match="not free"):
        free.take(3 * KB, 2 * KB)
    assert free.segments() == before
    free.take(KB, KB)
    assert free.segments() == [(0, KB), (2 * KB, 2 * KB)]
