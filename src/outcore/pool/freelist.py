"""A set of free address segments, the one data structure every pool and metric shares.

Segments are half-open ``[start, start + size)`` and never overlap. They are indexed twice:
by address (``_starts``, sorted) for first-fit, highest-fit and neighbour lookups, and by
``(size, start)`` (``_by_size``, sorted) for best-fit and the largest piece. ``add`` merges a
segment with its free neighbours when ``coalesce`` is on, except across a ``barrier`` address
(the border between two spaces that are not contiguous in reality, e.g. Dymem's main and
incremental spaces). Every method checks its preconditions before changing anything, so an
error leaves the set as it was.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort

from outcore.pool.errors import PoolError


class FreeList:
    """Free segments of an address space. ``total`` is the sum of their sizes."""

    def __init__(self, coalesce: bool = True, barriers: frozenset[int] = frozenset()) -> None:
        self.coalesce = coalesce
        self.barriers = barriers
        self._starts: list[int] = []
        self._size: dict[int, int] = {}
        self._by_size: list[tuple[int, int]] = []
        self.total = 0

    # ---- raw index maintenance --------------------------------------------------------
    def _insert(self, start: int, size: int) -> None:
        insort(self._starts, start)
        self._size[start] = size
        insort(self._by_size, (size, start))
        self.total += size

    def _remove(self, start: int) -> int:
        size = self._size.pop(start)
        del self._starts[bisect_left(self._starts, start)]
        del self._by_size[bisect_left(self._by_size, (size, start))]
        self.total -= size
        return size

    # ---- mutation ----------------------------------------------------------------------
    def add(self, start: int, size: int) -> None:
        """Mark ``[start, start + size)`` free, merging with free neighbours if coalescing.

        Raises PoolError if any byte of it is already free (a double free).
        """
        if size <= 0:
            raise PoolError(f"cannot free an empty range at {start} (size {size})")
        i = bisect_right(self._starts, start)
        left = self._starts[i - 1] if i > 0 else None
        right = self._starts[i] if i < len(self._starts) else None
        if left is not None and left + self._size[left] > start:
            raise PoolError(f"range [{start}, {start + size}) overlaps the free range "
                            f"[{left}, {left + self._size[left]}): freed twice?")
        if right is not None and start + size > right:
            raise PoolError(f"range [{start}, {start + size}) overlaps the free range "
                            f"[{right}, {right + self._size[right]}): freed twice?")
        if self.coalesce:
            if left is not None and left + self._size[left] == start and start not in self.barriers:
                size += start - left
                start = left
                self._remove(left)
            end = start + size
            if right is not None and right == end and end not in self.barriers:
                size += self._remove(right)
        self._insert(start, size)

    def take(self, start: int, size: int) -> None:
        """Mark ``[start, start + size)`` used; it must lie inside one free segment."""
        seg = self.containing(start)
        if seg is None or seg + self._size[seg] < start + size or size <= 0:
            raise PoolError(f"range [{start}, {start + size}) is not free, cannot allocate it")
        seg_size = self._remove(seg)
        if start > seg:
            self._insert(seg, start - seg)
        if start + size < seg + seg_size:
            self._insert(start + size, seg + seg_size - start - size)

    # ---- queries -----------------------------------------------------------------------
    def containing(self, addr: int) -> int | None:
        """Start of the free segment holding byte ``addr``, or None."""
        i = bisect_right(self._starts, addr) - 1
        if i >= 0 and addr < self._starts[i] + self._size[self._starts[i]]:
            return self._starts[i]
        return None

    def size_at(self, start: int) -> int:
        return self._size[start]

    def ending_at(self, addr: int) -> int | None:
        """Start of the free segment whose end is exactly ``addr``, or None."""
        i = bisect_left(self._starts, addr) - 1
        if i >= 0 and self._starts[i] + self._size[self._starts[i]] == addr:
            return self._starts[i]
        return None

    def best_fit(self, size: int) -> int | None:
        """Start of the smallest segment of at least ``size`` bytes (lowest address on ties)."""
        i = bisect_left(self._by_size, (size, -1))
        return self._by_size[i][1] if i < len(self._by_size) else None

    def first_fit(self, size: int, below: int | None = None) -> int | None:
        """Start of the lowest-addressed segment of at least ``size`` bytes.

        With ``below``, only segments that end at or before ``below`` count.
        """
        if self.largest() < size:
            return None
        for s in self._starts:
            if below is not None and s + self._size[s] > below:
                return None
            if self._size[s] >= size:
                return s
        return None

    def last_fit(self, size: int) -> int | None:
        """Start of the highest-addressed segment of at least ``size`` bytes."""
        if self.largest() < size:
            return None
        for s in reversed(self._starts):
            if self._size[s] >= size:
                return s
        return None

    def largest(self) -> int:
        """Size of the largest free segment (0 if none)."""
        return self._by_size[-1][0] if self._by_size else 0

    def bytes_below(self, size: int) -> int:
        """Free bytes held in segments smaller than ``size`` (too small to serve it)."""
        i = bisect_left(self._by_size, (size, -1))
        return sum(s for s, _ in self._by_size[:i])

    def segments(self) -> list[tuple[int, int]]:
        """Every free segment as ``(start, size)``, by address."""
        return [(s, self._size[s]) for s in self._starts]

    def __len__(self) -> int:
        return len(self._starts)
