"""moDNN's memory manager: a linked list of segments over the data region (DATE'18 §III-B).

"We use a linked list to represent the memory spatial distribution, where each node
corresponds to an occupied or free segment in the GPU memory, and an occupied segment
represents a data block in the TDFG." The scheduler (``modnn.schedule``) performs its
virtual allocations and frees here while it simulates the execution.

Choices the paper leaves open (written down here):

* allocation is **first fit** (the lowest-addressed free segment that is large enough), the
  classic policy of a linked-list allocator;
* a free segment merges with free neighbours at once, so two free segments are never
  adjacent;
* an offloading scheme (Fig. 4) is a run of *contiguous* segments, each free or held by an
  evictable block, whose total size reaches the request; ``schemes`` lists every such run,
  one per starting node, shortest first.

Invariants (``check`` asserts them): the segments tile ``[0, capacity)`` exactly in address
order, every size is positive, owners are unique, and no two free segments touch.
Owners are ints: storage ids of data blocks, negative ids for workspace.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass


@dataclass
class Segment:
    """``size`` bytes at ``start``; ``owner`` is None for a free segment."""

    start: int
    size: int
    owner: int | None = None


@dataclass(frozen=True)
class Scheme:
    """A run of contiguous segments that, once its blocks are evicted, holds ``size`` bytes."""

    first: int  # index of the first segment of the run
    owners: tuple[int, ...]  # the blocks to evict, in address order
    start: int  # address of the run


class SegmentList:
    """The data region ``[0, capacity)`` as an address-ordered list of segments."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"the data region cannot have a negative size ({capacity} B)")
        self.capacity = capacity
        self.segments: list[Segment] = [Segment(0, capacity)] if capacity > 0 else []
        self._where: dict[int, int] = {}  # owner -> start address

    # ---- queries ----------------------------------------------------------------------------
    def __contains__(self, owner: int) -> bool:
        return owner in self._where

    def owners(self) -> list[int]:
        """Every owner, in address order."""
        return [s.owner for s in self.segments if s.owner is not None]

    def used(self) -> int:
        return sum(s.size for s in self.segments if s.owner is not None)

    def largest_free(self) -> int:
        return max((s.size for s in self.segments if s.owner is None), default=0)

    def address(self, owner: int) -> int:
        return self._where[owner]

    # ---- allocation -------------------------------------------------------------------------
    def allocate(self, owner: int, size: int) -> int | None:
        """First fit: place ``owner`` (``size`` > 0 bytes); its address, or None if no free
        segment is large enough. Nothing changes on failure."""
        if size <= 0:
            raise ValueError(f"block {owner}: only positive sizes are placed, got {size}")
        if owner in self._where:
            raise ValueError(f"block {owner} is already placed at {self._where[owner]}")
        for i, seg in enumerate(self.segments):
            if seg.owner is None and seg.size >= size:
                if seg.size > size:
                    self.segments.insert(i + 1, Segment(seg.start + size, seg.size - size))
                    seg.size = size
                seg.owner = owner
                self._where[owner] = seg.start
                return seg.start
        return None

    def free(self, owner: int) -> None:
        """Release ``owner``'s segment and merge it with free neighbours."""
        start = self._where.pop(owner)
        i = self._index(start)
        seg = self.segments[i]
        seg.owner = None
        if i + 1 < len(self.segments) and self.segments[i + 1].owner is None:
            seg.size += self.segments.pop(i + 1).size
        if i > 0 and self.segments[i - 1].owner is None:
            self.segments[i - 1].size += self.segments.pop(i).size

    def _index(self, start: int) -> int:
        lo, hi = 0, len(self.segments)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.segments[mid].start < start:
                lo = mid + 1
            else:
                hi = mid
        return lo

    # ---- offloading schemes -----------------------------------------------------------------
    def schemes(self, size: int, evictable: Callable[[int], bool]) -> Iterator[Scheme]:
        """Every run of contiguous segments (free, or held by an ``evictable`` owner) that
        starts at some node and is just long enough to hold ``size`` bytes (Fig. 4)."""
        segs = self.segments
        for i in range(len(segs)):
            total, owners = 0, []
            for j in range(i, len(segs)):
                seg = segs[j]
                if seg.owner is not None:
                    if not evictable(seg.owner):
                        break
                    owners.append(seg.owner)
                total += seg.size
                if total >= size:
                    if owners:  # a run of free segments alone would have been allocated
                        yield Scheme(i, tuple(owners), segs[i].start)
                    break

    # ---- invariants -------------------------------------------------------------------------
    def check(self) -> None:
        """Raise AssertionError naming the first broken invariant (see the module docstring)."""
        at = 0
        seen: set[int] = set()
        for k, seg in enumerate(self.segments):
            assert seg.start == at, f"segment {k} starts at {seg.start}, expected {at}"
            assert seg.size > 0, f"segment {k} has size {seg.size}"
            if seg.owner is None:
                assert k == 0 or self.segments[k - 1].owner is not None, \
                    f"free segments {k - 1} and {k} touch but were not merged"
            else:
                assert seg.owner not in seen, f"owner {seg.owner} holds two segments"
                seen.add(seg.owner)
                assert self._where.get(seg.owner) == seg.start, f"owner {seg.owner} misplaced"
            at += seg.size
        assert at == self.capacity, f"segments cover {at} B of {self.capacity} B"
        assert seen == set(self._where), "the owner index and the segments disagree"
