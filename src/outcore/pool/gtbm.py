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
between the low- and high-end regions over the run (the largest address range of the main
space no block ever touched), set ``main = init - gap + beta`` and run again; each run that
fails gets ``beta`` more (``retry_step`` when ``beta`` is 0), as Dymem re-provisions after a
failed iteration. A squeezed run can fail because best fit may pick a different piece once
the middle gap is smaller; after ``max_retries`` the first (roomy) run is used.
"""

from __future__ import annotations

from collections.abc import Sequence

from outcore.pool.blocks import Block, round_up
from outcore.pool.errors import PoolError, PoolExhausted
from outcore.pool.freelist import FreeList
from outcore.pool.online import UNBOUNDED, OnlinePool
from outcore.pool.placement import Placement, build_placement, replay

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
        self.low = FreeList()
        self.low.add(0, main)
        self.incremental = FreeList()
        self.incremental.add(main, UNBOUNDED - main)

    @property
    def pool_size(self) -> int:
        """Main space plus the incremental space's high-water mark."""
        return max(self.main, self.high_water)

    def _place(self, block_id: int, reserved: int, hint: str) -> int:
        if hint in LOW_HINTS:
            start = self.low.best_fit(reserved)
        elif hint in HIGH_HINTS:
            seg = self.low.last_fit(reserved)
            start = None if seg is None else seg + self.low.size_at(seg) - reserved
        elif hint in INCREMENTAL_HINTS:
            start = self.incremental.best_fit(reserved)
            self.incremental.take(start, reserved)  # unbounded: always fits
            return start
        else:
            raise PoolError(f"block {block_id}: unknown mobility hint {hint!r} for the GTBM pool; "
                            f"use one of {', '.join(LOW_HINTS + HIGH_HINTS + INCREMENTAL_HINTS)}")
        if start is None:
            raise PoolExhausted(self.name, block_id, reserved, self.main, self.low.total,
                                self.low.largest())
        self.low.take(start, reserved)
        return start

    def _release(self, offset: int, reserved: int, hint: str) -> None:
        (self.incremental if offset >= self.main else self.low).add(offset, reserved)

    def _free_state(self) -> object:
        return (tuple(self.low.segments()), tuple(self.incremental.segments()))


def _untouched_gap(offsets: dict[int, int], sizes: dict[int, int], main: int) -> int:
    """The largest address range of ``[0, main)`` that no block ever occupied."""
    spans = sorted((offsets[i], offsets[i] + sizes[i]) for i in offsets if offsets[i] < main)
    gap, reach = 0, 0
    for lo, hi in spans:
        gap = max(gap, lo - reach)
        reach = max(reach, hi)
    return max(gap, main - reach)


def gtbm_placement(blocks: Sequence[Block], beta: int = 0, retry_step: int = 1 << 20,
                   max_retries: int = 32, init: int | None = None) -> Placement:
    """Place ``blocks`` with GTBM, squeezing the main space as Dymem does (see module doc).

    ``info`` records ``init``, ``squeeze_gap``, ``main``, ``incremental``, ``attempts``.
    """
    if beta < 0 or retry_step <= 0:
        raise PoolError(f"beta must be >= 0 and retry_step > 0, got {beta} and {retry_step}")
    gran = GTBMPool.granularity
    if init is None:
        init = sum(round_up(b.size, gran) for b in blocks
                   if b.mobility not in INCREMENTAL_HINTS) or gran
    roomy = GTBMPool(init)
    offsets, sizes = replay(roomy, blocks)
    gap = _untouched_gap(offsets, sizes, init)
    main = round_up(max(init - gap + beta, gran), gran)
    attempts = 1
    chosen = roomy
    while main < init and attempts <= max_retries:
        attempts += 1
        pool = GTBMPool(main)
        try:
            offsets_s, sizes_s = replay(pool, blocks)
        except PoolExhausted:
            main += round_up(beta or retry_step, gran)
            continue
        chosen, offsets, sizes = pool, offsets_s, sizes_s
        break
    info = {"init": init, "squeeze_gap": gap, "beta": beta, "main": chosen.main,
            "incremental": chosen.pool_size - chosen.main, "attempts": attempts}
    return build_placement("gtbm", blocks, offsets, sizes, chosen.pool_size,
                           barriers=(chosen.main,), info=info)
