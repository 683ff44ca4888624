"""Online pools: they see one ``allocate``/``free`` at a time, as a runtime allocator would.

* ``HeapPool``: SuperNeurons' heap (PPoPP'18 §3.2): the pool is cut into 1 KB blocks, a
  request takes the first free node (lowest address) with enough blocks, an ID-to-node hash
  (``live``) finds the node on free. The paper says the node is put back on the empty list;
  whether neighbours merge is not stated, so ``coalesce`` chooses (default: merge).
* ``BestFitPool``: CNMeM-like best fit (the smallest free piece that fits, lowest address on
  ties) with coalescing, at 512 B granularity like the CUDA caching allocator.

Sizes are rounded up to the pool's ``granularity``. With ``capacity=None`` a pool is unbounded
and its ``pool_size`` is the high-water mark of allocated addresses, i.e. the smallest pool
that would have served the same request stream with the same decisions. With a capacity,
a request that does not fit raises ``PoolExhausted`` naming the request and the pool size.
Invariants: live blocks never overlap; every error leaves the pool unchanged.
"""

from __future__ import annotations

from outcore.pool.blocks import round_up
from outcore.pool.errors import PoolError, PoolExhausted
from outcore.pool.freelist import FreeList

#: Address-space size of an unbounded pool: large enough never to be reached.
UNBOUNDED = 1 << 62


class OnlinePool:
    """Base of the online pools: the id-to-node table, rounding and error checks.

    Subclasses implement ``_place`` (choose and take an address, or raise PoolExhausted
    without changing anything) and ``_release``.
    """

    name = "online"
    granularity = 512

    def __init__(self, capacity: int | None = None) -> None:
        if capacity is not None and capacity <= 0:
            raise PoolError(f"pool capacity must be positive, got {capacity}")
        self.capacity = capacity
        self.live: dict[int, tuple[int, int, str]] = {}  # id -> (offset, reserved, hint)
        self.high_water = 0
        self.live_bytes = 0

    # ---- public API ----------------------------------------------------------------------
    def allocate(self, block_id: int, size: int, hint: str = "movable") -> int:
        """Reserve ``size`` bytes (rounded up) for ``block_id``; return its offset."""
        if block_id in self.live:
            off, res, _ = self.live[block_id]
            raise PoolError(f"block {block_id} is already allocated at [{off}, {off + res}) in "
                            f"the {self.name} pool; free it before allocating it again")
        if not isinstance(size, int) or size <= 0:
            raise PoolError(f"block {block_id}: size must be a positive int, got {size!r}")
        reserved = round_up(size, self.granularity)
        offset = self._place(block_id, reserved, hint)
        self.live[block_id] = (offset, reserved, hint)
        self.live_bytes += reserved
        self.high_water = max(self.high_water, offset + reserved)
        return offset

    def free(self, block_id: int) -> None:
        """Release ``block_id``; raises PoolError if it is not allocated here."""
        if block_id not in self.live:
            raise PoolError(f"free of unknown block {block_id}: it is not allocated in the "
                            f"{self.name} pool ({len(self.live)} blocks are live); free only "
                            "ids returned by allocate, once")
        offset, reserved, hint = self.live.pop(block_id)
        self.live_bytes -= reserved
        self._release(offset, reserved, hint)

    def offset_of(self, block_id: int) -> int:
        return self.live[block_id][0]

    @property
    def pool_size(self) -> int:
        """Bytes of pool needed so far (the high-water mark of allocated addresses)."""
        return self.high_water

    def snapshot(self) -> tuple[object, ...]:
        """The whole observable state, for checking that an error changed nothing."""
        return (dict(self.live), self.high_water, self.live_bytes, self._free_state())

    # ---- hooks -----------------------------------------------------------------------------
    def _place(self, block_id: int, reserved: int, hint: str) -> int:
        raise NotImplementedError

    def _release(self, offset: int, reserved: int, hint: str) -> None:
        raise NotImplementedError

    def _free_state(self) -> object:
        raise NotImplementedError


class _SingleSpacePool(OnlinePool):
    """One address space ``[0, capacity)`` (or unbounded) held in one FreeList."""

    coalesce = True

    def __init__(self, capacity: int | None = None) -> None:
        super().__init__(capacity)
        self.space = FreeList(coalesce=self.coalesce)
        self.space.add(0, UNBOUNDED if capacity is None else capacity)

    def _choose(self, reserved: int) -> int | None:
        raise NotImplementedError

    def _place(self, block_id: int, reserved: int, hint: str) -> int:
        start = self._choose(reserved)
        if start is None:
            raise PoolExhausted(self.name, block_id, reserved, self.capacity or UNBOUNDED,
                                self.space.total, self.space.largest())
        self.space.take(start, reserved)
        return start

    def _release(self, offset: int, reserved: int, hint: str) -> None:
        self.space.add(offset, reserved)

    def _free_state(self) -> object:
        return tuple(self.space.segments())


class HeapPool(_SingleSpacePool):
    """SuperNeurons' heap: 1 KB blocks, first fit, freed nodes back on the empty list."""

    name = "heap"
    granularity = 1024

    def __init__(self, capacity: int | None = None, coalesce: bool = True) -> None:
        self.coalesce = coalesce
        if not coalesce:
            self.name = "heap-nomerge"
        super().__init__(capacity)

    def _choose(self, reserved: int) -> int | None:
        return self.space.first_fit(reserved)


class BestFitPool(_SingleSpacePool):
    """CNMeM-like best fit with coalescing at 512 B granularity."""

    name = "best-fit"
    granularity = 512

    def _choose(self, reserved: int) -> int | None:
        return self.space.best_fit(reserved)
