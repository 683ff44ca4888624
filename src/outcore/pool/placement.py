"""The one result type of every placement policy, its invariant check and its metrics.

Every policy (online heap, best fit, GTBM, the offline planner) returns a ``Placement``, so
they are compared side by side with the same metrics, computed the same way by ``measure``
from nothing but the blocks, the offsets and the pool size:

* ``lower_bound``: the peak of live unrounded bytes; no placement can use less;
* ``per_step_used``: reserved (rounded) bytes of the live blocks at each step;
* ``per_step_footprint``: Dymem's "used" memory (§5.4, Fig. 15): allocated bytes plus the
  free but unusable bytes below the highest allocated address. Per ``Region`` of the pool:
  a one-ended region (filled from its bottom) counts everything below the free piece that
  reaches its top; a two-ended region (Dymem's main space, filled from both ends) counts
  everything but its largest free piece (the gap between the low and the high end);
* ``uf``: Dymem's unusable free space U_f (eq. 1) just before each allocation, in allocation
  order: the fraction of the pool's free bytes held in pieces smaller than the request. Eq. 1
  counts power-of-two nodes; with arbitrary sizes, "nodes of size >= the request" become
  "free pieces of at least the request's bytes". Free pieces never merge across region
  borders (e.g. Dymem's main and incremental spaces).

Invariants checked by ``check_placement`` (and so by every ``Placement`` built here): every
block has an offset, reserves at least its size, lies inside ``[0, pool_size)``, and no two
blocks live at the same step overlap. A violation raises PoolError naming the step and both
blocks.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from outcore.pool.blocks import (
    Alloc,
    Block,
    check_unique,
    event_stream,
    lower_bound,
    num_steps,
)
from outcore.pool.errors import PoolError
from outcore.pool.freelist import FreeList
from outcore.pool.online import OnlinePool


@dataclass(frozen=True)
class Region:
    """Addresses ``[start, end)`` of the pool filled from the bottom, or from both ends."""

    start: int
    end: int
    two_ended: bool = False


@dataclass
class Placement:
    """Offsets of every block in one pool of ``pool_size`` bytes, and how well it packs."""

    policy: str
    offsets: dict[int, int]
    sizes: dict[int, int]
    pool_size: int
    lower_bound: int
    per_step_used: list[int]
    per_step_footprint: list[int]
    uf: list[float]
    regions: tuple[Region, ...] = ()
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        """Pool size over the lower bound (1.0 is perfect)."""
        return self.pool_size / self.lower_bound if self.lower_bound else 1.0

    @property
    def mean_uf(self) -> float:
        return sum(self.uf) / len(self.uf) if self.uf else 0.0

    @property
    def peak_footprint(self) -> int:
        return max(self.per_step_footprint, default=0)


def check_placement(blocks: Sequence[Block], offsets: dict[int, int], sizes: dict[int, int],
                    pool_size: int) -> None:
    """Raise PoolError naming the step and the two blocks of the first overlap, or the first
    block that is unplaced, too small or outside the pool."""
    check_unique(blocks)
    by_id = {b.id: b for b in blocks}
    for b in blocks:
        if b.id not in offsets or b.id not in sizes:
            raise PoolError(f"{b.label()} has no offset: every block must be placed")
        off, size = offsets[b.id], sizes[b.id]
        if size < b.size:
            raise PoolError(f"{b.label()} reserves {size} B but needs {b.size} B")
        if off < 0 or off + size > pool_size:
            raise PoolError(f"{b.label()} at [{off}, {off + size}) lies outside the pool "
                            f"of {pool_size} B")
    occupied: list[tuple[int, int]] = []  # (offset, id) of live blocks, by address
    for ev in event_stream(blocks):
        if not isinstance(ev, Alloc):
            del occupied[bisect_left(occupied, (offsets[ev.id], ev.id))]
            continue
        off, end = offsets[ev.id], offsets[ev.id] + sizes[ev.id]
        i = bisect_left(occupied, (off, ev.id))
        for j in (i - 1, i):
            if 0 <= j < len(occupied):
                o_off, o_id = occupied[j]
                if o_off < end and off < o_off + sizes[o_id]:
                    raise PoolError(
                        f"step {ev.step}: {by_id[ev.id].label()} at [{off}, {end}) overlaps "
                        f"{by_id[o_id].label()} at [{o_off}, {o_off + sizes[o_id]}), "
                        "both live at that step")
        occupied.insert(i, (off, ev.id))


def _available_piece(free: FreeList, region: Region) -> int:
    """The free piece of ``region`` that counts as available (not in the footprint): the one
    reaching its top, or for a two-ended region its largest (the gap between the ends)."""
    if region.two_ended:
        return max((size for start, size in free.segments()
                    if region.start <= start < region.end), default=0)
    top = free.ending_at(region.end)
    return free.size_at(top) if top is not None and top >= region.start else 0


def measure(blocks: Sequence[Block], offsets: dict[int, int], sizes: dict[int, int],
            pool_size: int, regions: Sequence[Region] = ()
            ) -> tuple[list[int], list[int], list[float]]:
    """Per-step used bytes, per-step footprint and per-allocation U_f of a valid placement.

    ``regions`` default to one one-ended region covering the pool.
    """
    regions = tuple(regions) or (Region(0, pool_size),)
    free = FreeList(coalesce=True, barriers=frozenset(r.start for r in regions))
    for r in regions:
        if r.end > r.start:
            free.add(r.start, r.end - r.start)
    steps = num_steps(blocks)
    used: list[int] = []
    footprint: list[int] = []
    uf: list[float] = []
    live = 0

    def sample() -> None:
        used.append(live)
        footprint.append(pool_size - sum(_available_piece(free, r) for r in regions))

    step = 0
    for ev in event_stream(blocks):
        while step < min(ev.step, steps):  # sample every step that ended before this event
            sample()
            step += 1
        if ev.step >= steps:
            break
        size = sizes[ev.id]
        if isinstance(ev, Alloc):
            uf.append(free.bytes_below(size) / free.total if free.total else 0.0)
            free.take(offsets[ev.id], size)
            live += size
        else:
            free.add(offsets[ev.id], size)
            live -= size
    while step < steps:
        sample()
        step += 1
    return used, footprint, uf


def build_placement(policy: str, blocks: Sequence[Block], offsets: dict[int, int],
                    sizes: dict[int, int], pool_size: int, regions: Sequence[Region] = (),
                    info: dict[str, Any] | None = None) -> Placement:
    """Check ``offsets`` and wrap them with their metrics in a Placement."""
    check_placement(blocks, offsets, sizes, pool_size)
    regions = tuple(regions) or (Region(0, pool_size),)
    used, footprint, uf = measure(blocks, offsets, sizes, pool_size, regions)
    return Placement(policy=policy, offsets=dict(offsets), sizes=dict(sizes),
                     pool_size=pool_size, lower_bound=lower_bound(blocks),
                     per_step_used=used, per_step_footprint=footprint, uf=uf,
                     regions=regions, info=dict(info or {}))


def replay(pool: OnlinePool, blocks: Sequence[Block]) -> tuple[dict[int, int], dict[int, int]]:
    """Feed the alloc/free stream of ``blocks`` to ``pool``; return offsets and reserved sizes.

    Raises whatever the pool raises (PoolExhausted when a fixed-size pool is too small).
    """
    check_unique(blocks)
    offsets: dict[int, int] = {}
    sizes: dict[int, int] = {}
    for ev in event_stream(blocks):
        if isinstance(ev, Alloc):
            offsets[ev.id] = pool.allocate(ev.id, ev.size, ev.hint)
            sizes[ev.id] = pool.live[ev.id][1]
        else:
            pool.free(ev.id)
    return offsets, sizes


def run_online(pool: OnlinePool, blocks: Sequence[Block]) -> Placement:
    """Replay ``blocks`` through ``pool`` and measure the result."""
    offsets, sizes = replay(pool, blocks)
    return build_placement(pool.name, blocks, offsets, sizes, pool.pool_size)
