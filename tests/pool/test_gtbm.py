"""Dymem's GTBM pool: arenas by mobility, the squeeze with beta, retries, bad hints."""

from __future__ import annotations

import pytest

from outcore.pool import Block, GTBMPool, PoolError, PoolExhausted, gtbm_placement, place
from outcore.pool.placement import replay
from outcore.pool.synthetic import random_blocks

KB = 1024

# m1 movable lives 0-1; T temporary (a tensor waiting for a join) lives 1-5; m2 movable 2-3
# needs 200K. Best fit puts T right above m1, so m2 fits in no hole: the pool grows to 400K.
# GTBM puts T at the high end: m2 reuses m1's space and the squeezed pool is 300K.
JOIN = [Block(0, 100 * KB, 0, 1, "movable"), Block(1, 100 * KB, 1, 5, "temporary"),
        Block(2, 200 * KB, 2, 3, "movable")]


def test_movable_low_temporary_high_reclaimed_incremental():
    pool = GTBMPool(main=64 * KB)
    assert pool.allocate(0, 4 * KB, "movable") == 0
    assert pool.allocate(1, 4 * KB, "temporary") == 60 * KB
    assert pool.allocate(2, 8 * KB, "temporary") == 52 * KB
    assert pool.allocate(3, 2 * KB, "static") == 4 * KB
    assert pool.allocate(4, 10 * KB, "reclaimed") == 64 * KB  # incremental space
    assert pool.pool_size == 74 * KB
    pool.free(1)
    assert pool.allocate(5, 2 * KB, "temporary") == 62 * KB  # highest free piece, its top


def test_gtbm_beats_best_fit_on_a_join_and_squeezes_to_the_lower_bound():
    gtbm, best = gtbm_placement(JOIN), place(JOIN, "best-fit")
    assert best.pool_size == 400 * KB
    assert gtbm.pool_size == 300 * KB == gtbm.lower_bound
    assert gtbm.info["init"] == 400 * KB and gtbm.info["squeeze_gap"] == 100 * KB
    assert gtbm.offsets == {0: 0, 1: 200 * KB, 2: 0}
    assert gtbm.info["failed"] >= 1  # beta 0 bisects below 300K, which cannot work


def test_beta_is_kept_as_headroom():
    result = gtbm_placement(JOIN, beta=50 * KB)
    assert result.info["main"] == 350 * KB  # 400K - 100K gap + beta; then gap 50K <= beta
    assert result.info["runs"] == 2 and result.info["failed"] == 0


def test_a_squeezed_run_that_fails_gets_beta_more():
    # random instances whose squeeze changes best-fit decisions so that a run fails
    beta = 4 * KB
    failing = [s for s in range(40)
               if gtbm_placement(random_blocks(40, seed=s), beta=beta).info["failed"]]
    assert failing, "no random instance exercised the retry path"
    blocks = random_blocks(40, seed=failing[0])
    result = gtbm_placement(blocks, beta=beta)
    with pytest.raises(PoolExhausted):  # the size recorded as failed really fails
        replay(GTBMPool(result.info["largest_failed"]), blocks)
    assert result.info["main"] > result.info["largest_failed"] > 0
    assert result.info["main"] < result.info["init"]


def test_unknown_hint_is_refused_and_changes_nothing():
    pool = GTBMPool(main=16 * KB)
    pool.allocate(0, KB, "movable")
    before = pool.snapshot()
    with pytest.raises(PoolError, match="unknown mobility hint 'sticky'"):
        pool.allocate(1, KB, "sticky")
    assert pool.snapshot() == before


def test_main_space_exhausted_names_sizes():
    pool = GTBMPool(main=16 * KB)
    with pytest.raises(PoolExhausted, match=f"request is {32 * KB} B.*pool is {16 * KB} B"):
        pool.allocate(0, 32 * KB, "temporary")
    assert pool.snapshot()[0] == {}


def test_footprint_counts_both_ends_of_the_main_space():
    result = gtbm_placement(JOIN)
    # steps 0..5: m1 | m1+T | T+m2 (fills the 300K main) | T+m2 | T | T
    assert result.per_step_footprint == [100 * KB, 200 * KB, 300 * KB, 300 * KB, 100 * KB, 100 * KB]
    assert result.regions[0].two_ended
