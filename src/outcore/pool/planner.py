"""The offline planner: knows every lifetime up front and assigns offsets (outcore's default).

Two methods, each returning offsets for the same rounded sizes:

* ``size`` (greedy by size, as TFLite's and XLA's planners): blocks in decreasing size
  (longer lifetime first on ties); each goes into the smallest gap, between the blocks
  already placed that share a step with it, that fits, or on top of them. A segment tree
  over time (``TimeIndex``) finds those blocks; the cost grows with the number of pairs of
  blocks that are live together, so it suits graphs of up to a few tens of thousands of
  blocks.
* ``sweep``: blocks in allocation order through a best-fit free list, as an online pool
  would, but using the future: inside the chosen free piece a block goes to the end whose
  neighbour dies closest in time to it, so the two free up together and their space merges.
  O(n log n) plus the free-list work: 100,000 blocks in well under a second.

``auto`` (the default) runs ``sweep`` and, when the number of overlapping pairs is at most
``pair_limit``, also ``size``, and keeps whichever needs the smaller pool. Sizes are rounded
up to ``granularity`` (512 B, like the CUDA caching allocator).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from typing import Literal

from outcore.pool.blocks import Alloc, Block, check_unique, events, num_steps, round_up
from outcore.pool.errors import PoolError
from outcore.pool.freelist import FreeList
from outcore.pool.online import UNBOUNDED
from outcore.pool.placement import Placement, build_placement
from outcore.pool.timeindex import TimeIndex

Method = Literal["auto", "size", "sweep"]
GRANULARITY = 512
PAIR_LIMIT = 3_000_000


def overlapping_pairs(blocks: Sequence[Block]) -> int:
    """How many pairs of blocks share at least one step (O(n log n))."""
    ends = sorted(b.end for b in blocks)
    starts = sorted(b.start for b in blocks)
    # pairs (a, b) with a.start <= b.start and a.end >= b.start, a != b
    total = 0
    for i, s in enumerate(starts):
        started_before = i  # blocks earlier in start order
        ended_before = bisect_right(ends, s - 1)
        total += started_before - ended_before
    return total


def greedy_by_size(blocks: Sequence[Block], sizes: dict[int, int]) -> dict[int, int]:
    """Offsets by the greedy-by-size rule (see the module doc)."""
    order = sorted(blocks, key=lambda b: (-sizes[b.id], b.start - b.end, b.start, b.id))
    index = TimeIndex(num_steps(blocks))
    offsets: dict[int, int] = {}
    for b in order:
        size = sizes[b.id]
        spans = sorted((offsets[i], offsets[i] + sizes[i]) for i in index.overlapping(b.start, b.end))
        best, best_gap, reach = -1, UNBOUNDED, 0
        for lo, hi in spans:
            gap = lo - reach
            if size <= gap < best_gap:
                best, best_gap = reach, gap
            reach = max(reach, hi)
        offsets[b.id] = reach if best < 0 else best
        index.add(b.id, b.start, b.end)
    return offsets


def sweep(blocks: Sequence[Block], sizes: dict[int, int]) -> dict[int, int]:
    """Offsets by the lifetime-aware best-fit sweep (see the module doc)."""
    end_of = {b.id: b.end for b in blocks}
    free = FreeList()
    free.add(0, UNBOUNDED)
    by_start: dict[int, int] = {}  # offset -> live block starting there
    by_end: dict[int, int] = {}  # end address -> live block ending there
    offsets: dict[int, int] = {}
    for ev in events(blocks):
        if not isinstance(ev, Alloc):
            off = offsets[ev.id]
            del by_start[off]
            del by_end[off + sizes[ev.id]]
            free.add(off, sizes[ev.id])
            continue
        size = sizes[ev.id]
        seg = free.best_fit(size)
        assert seg is not None  # the free list is unbounded
        seg_end = seg + free.size_at(seg)
        off = seg
        if seg_end < UNBOUNDED and free.size_at(seg) > size:
            left, right = by_end.get(seg), by_start.get(seg_end)
            mine = end_of[ev.id]
            d_left = abs(end_of[left] - mine) if left is not None else UNBOUNDED
            d_right = abs(end_of[right] - mine) if right is not None else UNBOUNDED
            if d_right < d_left:
                off = seg_end - size
        free.take(off, size)
        offsets[ev.id] = off
        by_start[off] = ev.id
        by_end[off + size] = ev.id
    return offsets


def plan_offsets(blocks: Sequence[Block], granularity: int = GRANULARITY,
                 method: Method = "auto", pair_limit: int = PAIR_LIMIT
                 ) -> tuple[dict[int, int], dict[int, int], str]:
    """Offsets, rounded sizes and the method that produced them (see the module doc)."""
    check_unique(blocks)
    sizes = {b.id: round_up(b.size, granularity) for b in blocks}
    if method == "size":
        return greedy_by_size(blocks, sizes), sizes, "size"
    if method == "sweep":
        return sweep(blocks, sizes), sizes, "sweep"
    if method != "auto":
        raise PoolError(f"unknown planner method {method!r}; use 'auto', 'size' or 'sweep'")
    best, best_method = sweep(blocks, sizes), "sweep"
    if overlapping_pairs(blocks) <= pair_limit:
        by_size = greedy_by_size(blocks, sizes)
        if _extent(by_size, sizes) < _extent(best, sizes):
            best, best_method = by_size, "size"
    return best, sizes, best_method


def _extent(offsets: dict[int, int], sizes: dict[int, int]) -> int:
    return max((offsets[i] + sizes[i] for i in offsets), default=0)


def planned_placement(blocks: Sequence[Block], granularity: int = GRANULARITY,
                      method: Method = "auto", pair_limit: int = PAIR_LIMIT) -> Placement:
    """Plan offsets for ``blocks`` and measure them (the pool is exactly their extent)."""
    offsets, sizes, used = plan_offsets(blocks, granularity, method, pair_limit)
    return build_placement("planned", blocks, offsets, sizes, _extent(offsets, sizes),
                           info={"method": used})
