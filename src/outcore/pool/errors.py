"""Errors of the memory pools. Both leave the pool exactly as it was before the call."""

from __future__ import annotations

from outcore.errors import DeviceOutOfMemory, OutcoreError
from outcore.units import format_bytes


class PoolError(OutcoreError):
    """A pool was used wrongly: free of an unknown block, a block allocated twice, a bad size,
    an unknown mobility hint, or a placement that breaks an invariant (overlap, outside the pool).
    """


class PoolExhausted(DeviceOutOfMemory):
    """A request does not fit in a pool of fixed size (too big, or the free space is fragmented).

    Attributes (besides DeviceOutOfMemory's ``tensor``, ``wanted``, ``free``, ``capacity``):
        block: the id of the block that did not fit.
        largest_free: the largest contiguous free piece at that moment, in bytes.
    """

    def __init__(self, pool: str, block: int, wanted: int, capacity: int, free: int,
                 largest_free: int) -> None:
        # DeviceOutOfMemory's own message does not mention fragmentation: build ours instead.
        OutcoreError.__init__(self, (
            f"{pool} pool cannot place block {block}: the request is {wanted} B "
            f"({format_bytes(wanted)}) but the pool is {capacity} B ({format_bytes(capacity)}) "
            f"with {free} B free, the largest free piece {largest_free} B. "
            + ("The request is larger than the whole pool; " if wanted > capacity else
               "The free space is too fragmented or too small; ")
            + "give the pool more bytes or free blocks before this request."
        ))
        self.tensor = f"block {block}"
        self.wanted = wanted
        self.free = free
        self.capacity = capacity
        self.block = block
        self.largest_free = largest_free
