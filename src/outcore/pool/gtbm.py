"""Dymem's Group-Tensors-By-Mobility pool (HPDC'20 §3.3) and its pool-size squeeze.

The pool has a main space ``[0, main)`` and an incremental space above it:

* ``movable`` (and ``static``) blocks are allocated from the low end of the main space with
  best fit (CNMeM's ``cnmemMalloc``);
* ``temporary`` blocks from the high end: the highest free piece that fits, and the top of
  that piece (Dymem's ``cnmemHighMalloc``);
* ``reclaimed`` blocks go to the incremental space, which grows on demand (``cudaMalloc``
  outside the pool), best fit inside it.

Free pieces never merge across the main/incremental border. The pool size is the main
space plus the incremental space's high-water mark.

Squeeze (§3.3.3): run once with a main space large enough for anything (the sum of all
rounded main-space sizes: the low and high extents together never exceed what was
allocated so far, so the middle gap always fits the next request), find the smallest gap
between the low- and high-end regions over the run (the minimum over the steps of the main
space's largest free piece), set ``main = init - gap + beta`` and run again, as Dymem
adjusts the pool from one training iteration to the next. A squeezed run may lay blocks out
differently (best fit can pick another piece once the middle gap is smaller): if it fails,
it gets ``beta`` more, as Dymem re-provisions after a failed iteration; if it fits but
leaves a gap larger than ``beta``, it is squeezed again. With ``beta == 0`` (the default)
failures are instead resolved by bisection between the largest main space that failed and
the smallest that worked: an idealised Dymem given as many trial iterations as it needs,
the fairest size to compare GTBM with. At most ``max_runs`` replays; the smallest main
space that worked is kept.
"""

from __future__ import annotations

from collections.abc import Sequence

from outcore.pool.blocks import Block, round_up
from outcore.pool.errors import PoolError, PoolExhausted
from outcore.pool.freelist import FreeList
from outcore.pool.online import UNBOUNDED, OnlinePool
from outcore.pool.placement import Placement, Region, build_placement, measure, replay

LOW_HINTS = ("movable", "static")
HIGH_HINTS = ("temporary",)
INCREMENTAL_HINTS = ("reclaimed",)


class GTBMPool(OnlinePool):
    """Dymem's GTBM pool with a main space of ``main`` bytes (the ``capacity``)."""

    name = "gtbm"
    granularity = 512

    def __init__(self, main: int) -> None:
        super().__init__(main)
        self.main = main
        self.space = FreeList()
        self.space.add(0, main)
        self.incremental = FreeList()
        self.incremental.add(main, UNBOUNDED - main)

    @property
    def pool_size(self) -> int:
        """Main space plus the incremental space's high-water mark."""
        return max(self.main, self.high_water)

    def _place(self, block_id: int, reserved: int, hint: str) -> int:
        if hint in LOW_HINTS:
            start = self.space.best_fit(reserved)
        elif hint in HIGH_HINTS:
            seg = self.space.last_fit(reserved)
            start = None if seg is None else seg + self.space.size_at(seg) - reserved
        elif hint in INCREMENTAL_HINTS:
            start = self.incremental.best_fit(reserved)
            assert start is not None  # the incremental space is unbounded
            self.incremental.take(start, reserved)
            return start
        else:
            raise PoolError(f"block {block_id}: unknown mobility hint {hint!r} for the GTBM pool; "
                            f"use one of {', '.join(LOW_HINTS + HIGH_HINTS + INCREMENTAL_HINTS)}")
        if start is None:
            raise PoolExhausted(self.name, block_id, reserved, self.main, self.space.total,
                                self.space.largest())
        self.space.take(start, reserved)
        return start

    def _release(self, offset: int, reserved: int, hint: str) -> None:
        (self.incremental if offset >= self.main else self.space).add(offset, reserved)

    def _free_state(self) -> object:
        return (tuple(self.space.segments()), tuple(self.incremental.segments()))


def _squeeze_gap(blocks: Sequence[Block], offsets: dict[int, int], sizes: dict[int, int],
                 main: int) -> int:
    """Dymem's ``min{highest_avail - lowest_avail}``: the smallest, over the steps, of the
    largest free piece of the main space (the gap between its low and high ends)."""
    inside = [b for b in blocks if offsets[b.id] < main]
    if not inside:
        return main
    _, footprint, _ = measure(inside, offsets, sizes, main, (Region(0, main, two_ended=True),))
    return main - max(footprint)


def gtbm_placement(blocks: Sequence[Block], beta: int = 0, max_runs: int = 40,
                   init: int | None = None) -> Placement:
    """Place ``blocks`` with GTBM, squeezing the main space as Dymem does (see module doc).

    ``info`` records ``init``, ``squeeze_gap`` (of the first run), ``beta``, ``main``,
    ``incremental``, ``runs`` (every replay, the first roomy one included), ``failed``
    (squeezed runs that did not fit) and ``largest_failed`` (the largest main space that
    failed, 0 if none).
    """
    if beta < 0 or max_runs < 1:
        raise PoolError(f"beta must be >= 0 and max_runs >= 1, got {beta} and {max_runs}")
    if not blocks:
        return build_placement("gtbm", blocks, {}, {}, 0)
    gran = GTBMPool.granularity
    if init is None:
        init = sum(round_up(b.size, gran) for b in blocks
                   if b.mobility not in INCREMENTAL_HINTS) or gran
    best = GTBMPool(init)
    offsets, sizes = replay(best, blocks)
    first_gap = gap = _squeeze_gap(blocks, offsets, sizes, init)
    runs, failed, too_small = 1, 0, 0  # too_small: the largest main space that failed
    nxt = best.main - gap + beta
    while runs < max_runs:
        nxt = round_up(max(nxt, gran), gran)
        if not too_small < nxt < best.main:
            if beta:
                break
            nxt = round_up((too_small + best.main) // 2, gran)  # beta 0: bisect
            if not too_small < nxt < best.main:
                break
        runs += 1
        pool = GTBMPool(nxt)
        try:
            offsets_s, sizes_s = replay(pool, blocks)
        except PoolExhausted:  # Dymem: a failed iteration is given beta more
            failed += 1
            too_small = nxt
            nxt += beta
            continue
        best, offsets, sizes = pool, offsets_s, sizes_s
        gap = _squeeze_gap(blocks, offsets, sizes, nxt)  # squeeze what this run left unused
        if beta and gap <= beta:
            break
        nxt = best.main - gap + beta
    info = {"init": init, "squeeze_gap": first_gap, "beta": beta, "main": best.main,
            "incremental": best.pool_size - best.main, "runs": runs, "failed": failed,
            "largest_failed": too_small}
    regions = [Region(0, best.main, two_ended=True)]
    if best.pool_size > best.main:
        regions.append(Region(best.main, best.pool_size))
    return build_placement("gtbm", blocks, offsets, sizes, best.pool_size,
                           regions=regions, info=info)
