"""A host buffer pool carved by offsets: big buffers allocated rarely, slices handed out.

Pinned (page-locked) host memory costs milliseconds per allocation and serialises with
the GPU, so the CUDA device allocates a few large pinned segments and places each host
copy at an offset in one of them. ``OffsetAllocator`` is the plain-Python first-fit
allocator over one segment; ``HostPool`` owns the segments.

Invariants: live ranges never overlap; every offset is a multiple of ``alignment``; a
freed range is merged with free neighbours, so allocating and freeing everything returns
the segment to one free block.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass

import torch


def align_up(nbytes: int, alignment: int) -> int:
    """The bytes an allocation of ``nbytes`` takes: a multiple of ``alignment``, at least one."""
    return max(alignment, -(-nbytes // alignment) * alignment)


class OffsetAllocator:
    """First-fit allocation of aligned byte ranges inside ``[0, size)``."""

    def __init__(self, size: int, alignment: int = 256) -> None:
        if size < 0 or alignment <= 0:
            raise ValueError(f"need size >= 0 and alignment > 0, got {size}, {alignment}")
        self.size = size
        self.alignment = alignment
        self._free: list[tuple[int, int]] = [(0, size)] if size else []  # sorted (start, len)
        self._used: dict[int, int] = {}

    def alloc(self, nbytes: int) -> int | None:
        """Offset of a free range of at least ``nbytes``, or None if none fits."""
        if nbytes < 0:
            raise ValueError(f"cannot allocate {nbytes} bytes")
        need = align_up(nbytes, self.alignment)
        for i, (start, length) in enumerate(self._free):
            if length >= need:
                if length == need:
                    del self._free[i]
                else:
                    self._free[i] = (start + need, length - need)
                self._used[start] = need
                return start
        return None

    def free(self, offset: int) -> None:
        """Return the range at ``offset``; merges it with free neighbours."""
        length = self._used.pop(offset, None)
        if length is None:
            raise ValueError(f"offset {offset} is not allocated")
        i = bisect.bisect_left(self._free, (offset, 0))
        if i < len(self._free) and offset + length == self._free[i][0]:
            length += self._free.pop(i)[1]
        if i > 0 and self._free[i - 1][0] + self._free[i - 1][1] == offset:
            offset, prev = self._free[i - 1][0], self._free[i - 1][1]
            length += prev
            i -= 1
            del self._free[i]
        self._free.insert(i, (offset, length))

    @property
    def used_bytes(self) -> int:
        return sum(self._used.values())

    @property
    def largest_free(self) -> int:
        return max((length for _, length in self._free), default=0)

    def free_ranges(self) -> list[tuple[int, int]]:
        """The free (start, length) ranges, sorted by start."""
        return list(self._free)


@dataclass(frozen=True)
class HostSlot:
    """A range handed out by ``HostPool``: ``view`` is a flat uint8 tensor over it."""

    segment: int
    offset: int
    view: torch.Tensor


class HostPool:
    """Segments from ``allocate(nbytes)`` (e.g. pinned), carved by ``OffsetAllocator``.

    Sizing: ``reserve(nbytes)`` adds one segment of exactly ``nbytes`` (aligned) when no
    segment has that much contiguous room, so a pool reserved for a plan's host peak (the
    sum of its offloads, each aligned) never grows during the step and holds at most
    ``host peak + (alignment - 1) x offloads`` bytes. Without a reservation, the first
    segment has ``segment_bytes`` and, when nothing fits, a new segment of
    ``max(segment_bytes, 2 * largest so far, nbytes rounded up to alignment)`` is added
    (capped so that the pool stays within ``limit``). ``segments_allocated`` counts calls
    to ``allocate``, the expensive operation this pool exists to avoid repeating.

    ``limit`` (bytes, None: none) bounds the sum of the segments: a growth past it raises
    ``HostOutOfMemory``. ``release(buffer)`` is called for every segment by ``close()``
    (e.g. to unpin it).
    """

    def __init__(self, segment_bytes: int, allocate: Callable[[int], torch.Tensor],
                 alignment: int = 64, *, release: Callable[[torch.Tensor], None] | None = None,
                 limit: int | None = None) -> None:
        if segment_bytes <= 0:
            raise ValueError(f"segment_bytes must be > 0, got {segment_bytes}")
        self.segment_bytes = segment_bytes
        self.alignment = alignment
        self.limit = limit
        self._allocate = allocate
        self._release = release
        self._segments: list[tuple[torch.Tensor, OffsetAllocator]] = []
        self.peak_used = 0

    @property
    def segments_allocated(self) -> int:
        return len(self._segments)

    @property
    def capacity(self) -> int:
        return sum(a.size for _, a in self._segments)

    @property
    def used_bytes(self) -> int:
        return sum(a.used_bytes for _, a in self._segments)

    def try_alloc(self, nbytes: int) -> HostSlot | None:
        """A slot in an existing segment, or None (never allocates a segment)."""
        for i, (buffer, allocator) in enumerate(self._segments):
            offset = allocator.alloc(nbytes)
            if offset is not None:
                self.peak_used = max(self.peak_used, self.used_bytes)
                return HostSlot(i, offset, buffer[offset:offset + nbytes])
        return None

    def alloc(self, nbytes: int) -> HostSlot:
        """A slot of ``nbytes``, adding a segment if no existing one has room."""
        slot = self.try_alloc(nbytes)
        if slot is not None:
            return slot
        largest = max((a.size for _, a in self._segments), default=0)
        need = align_up(nbytes, self.alignment)
        size = max(self.segment_bytes, 2 * largest, need)
        if self.limit is not None and self.capacity + size > self.limit:
            size = need  # the least growth that serves this request
        self._grow(size)
        slot = self.try_alloc(nbytes)
        assert slot is not None, "a fresh segment must fit the request"
        return slot

    def reserve(self, nbytes: int) -> None:
        """Make sure ``nbytes`` of contiguous room exist (one exact segment if not)."""
        room = max((a.largest_free for _, a in self._segments), default=0)
        if nbytes > 0 and room < nbytes:
            self._grow(align_up(nbytes, self.alignment))

    def free(self, slot: HostSlot) -> None:
        self._segments[slot.segment][1].free(slot.offset)

    def overhead(self) -> float:
        """Bytes held over the most bytes ever in use (1.0: nothing wasted; inf: unused)."""
        return self.capacity / self.peak_used if self.peak_used else float("inf")

    def close(self) -> None:
        """Give every segment back (through ``release``); the pool can be used again after."""
        segments, self._segments = self._segments, []
        for buffer, _ in segments:
            if self._release is not None:
                self._release(buffer)

    def _grow(self, size: int) -> None:
        if self.limit is not None and self.capacity + size > self.limit:
            from outcore.host import HostOutOfMemory

            raise HostOutOfMemory(size, self.capacity, self.limit)
        self._segments.append((self._allocate(size), OffsetAllocator(size, self.alignment)))
