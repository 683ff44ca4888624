"""The online pools: known layouts, Dymem's fragmentation examples, and bad input."""

from __future__ import annotations

import pytest

from outcore.errors import DeviceOutOfMemory
from outcore.pool import BestFitPool, Block, HeapPool, PoolError, PoolExhausted, run_online

KB = 1024
MB = 1 << 20


def _script(pool, script):
    """Run ("a", id, size) / ("f", id) steps; return the offsets allocated, by id."""
    offsets = {}
    for step in script:
        if step[0] == "a":
            offsets[step[1]] = pool.allocate(step[1], step[2])
        else:
            pool.free(step[1])
    return offsets


# A: 4K, B: 1K, C: 2K, D: 1K; free A and C (holes of 4K at 0 and 2K at 5K); then E: 2K, F: 4K.
HOLES = [("a", 0, 4 * KB), ("a", 1, KB), ("a", 2, 2 * KB), ("a", 3, KB), ("f", 0), ("f", 2),
         ("a", 4, 2 * KB), ("a", 5, 4 * KB)]


@pytest.mark.parametrize("pool, e_at, f_at, size", [
    (HeapPool(), 0, 8 * KB, 12 * KB),         # first fit splits the 4K hole, F no longer fits
    (BestFitPool(), 5 * KB, 0, 8 * KB),       # best fit fills the 2K hole exactly, F reuses A's
])
def test_first_fit_and_best_fit_choose_different_holes(pool, e_at, f_at, size):
    offsets = _script(pool, HOLES)
    assert (offsets[4], offsets[5]) == (e_at, f_at)
    assert pool.pool_size == size


def test_heap_uses_1kb_blocks_and_best_fit_512b():
    heap, best = HeapPool(), BestFitPool()
    assert [heap.allocate(i, s) for i, s in enumerate([1, 1025, 100])] == [0, KB, 3 * KB]
    assert [best.allocate(i, s) for i, s in enumerate([1, 513, 100])] == [0, 512, 1536]
    assert heap.live_bytes == 4 * KB and best.live_bytes == 2048


def test_heap_without_merging_cannot_reuse_two_adjacent_holes():
    script = [("a", 0, KB), ("a", 1, KB), ("a", 2, KB), ("f", 0), ("f", 1), ("a", 3, 2 * KB)]
    assert _script(HeapPool(), script)[3] == 0
    assert _script(HeapPool(coalesce=False), script)[3] == 3 * KB


def test_dymem_fig6_freed_regions_that_are_not_contiguous_do_not_coalesce():
    """512, 512, 1024 MB in a 2 GB pool; t0 and t2 freed: 1.5 GB free, no 1.5 GB piece."""
    pool = BestFitPool(capacity=2048 * MB)
    _script(pool, [("a", 0, 512 * MB), ("a", 1, 512 * MB), ("a", 2, 1024 * MB), ("f", 0), ("f", 2)])
    assert pool.space.segments() == [(0, 512 * MB), (1024 * MB, 1024 * MB)]
    with pytest.raises(PoolExhausted) as err:
        pool.allocate(3, 1536 * MB)
    assert err.value.free == 1536 * MB and err.value.largest_free == 1024 * MB
    assert "fragmented" in str(err.value)


def test_dymem_fig7_best_fit_grows_the_pool_for_a_nonlinear_block():
    """200 MB and 300 MB holes around a long-lived tensor cannot serve 400 MB: the pool grows."""
    blocks = [Block(0, 200 * MB, 0, 0), Block(1, 100 * MB, 0, 2, "temporary"),
              Block(2, 300 * MB, 0, 0), Block(3, 100 * MB, 0, 2), Block(4, 400 * MB, 1, 2)]
    placement = run_online(BestFitPool(), blocks)
    assert placement.offsets[4] == 700 * MB
    assert placement.pool_size == 1100 * MB and placement.lower_bound == 700 * MB
    # U_f(400 MB) in the 1100 MB pool: 500 of the 900 free MB lie in pieces too small
    assert placement.uf[-1] == pytest.approx(500 / 900)


def test_request_larger_than_the_pool_names_both_sizes_and_changes_nothing():
    pool = BestFitPool(capacity=8 * KB)
    pool.allocate(0, 2 * KB)
    before = pool.snapshot()
    with pytest.raises(PoolExhausted) as err:
        pool.allocate(1, 9 * KB)
    assert isinstance(err.value, DeviceOutOfMemory)
    message = str(err.value)
    assert "block 1" in message and str(9 * KB) in message and str(8 * KB) in message
    assert "larger than the whole pool" in message
    assert pool.snapshot() == before
    assert pool.allocate(1, 6 * KB) == 2 * KB  # the pool still works


@pytest.mark.parametrize("pool", [HeapPool(), BestFitPool(), HeapPool(coalesce=False)])
def test_free_of_unknown_block_names_it_and_changes_nothing(pool):
    pool.allocate(0, KB)
    pool.allocate(1, KB)
    pool.free(0)
    before = pool.snapshot()
    for bad in (0, 42):
        with pytest.raises(PoolError, match=f"free of unknown block {bad}"):
            pool.free(bad)
        assert pool.snapshot() == before
    with pytest.raises(PoolError, match="block 1 is already allocated"):
        pool.allocate(1, KB)
    with pytest.raises(PoolError, match="positive int"):
        pool.allocate(5, 0)
    assert pool.snapshot() == before


def test_capacity_must_be_positive():
    with pytest.raises(PoolError, match="capacity"):
        BestFitPool(capacity=0)
