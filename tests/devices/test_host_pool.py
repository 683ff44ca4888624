"""The offset allocator and host pool behind the CUDA device's pinned memory."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from outcore.runtime.devices.host_pool import HostPool, OffsetAllocator, align_up


@pytest.mark.parametrize("ops, expected_offsets, expected_free", [
    # (size, alignment) = (1024, 256); "a n" allocates n bytes, "f k" frees the k-th allocation
    (["a 100", "a 256", "a 1"], [0, 256, 512], [(768, 256)]),
    (["a 300", "a 300", "f 0", "a 200"], [0, 512, 0], [(256, 256)]),
    (["a 256", "a 256", "a 256", "f 1", "f 0"], [0, 256, 512], [(0, 512), (768, 256)]),
    (["a 256", "a 256", "a 256", "f 0", "f 2", "f 1"], [0, 256, 512], [(0, 1024)]),
    (["a 1024", "a 1"], [0, None], []),
    (["a 0"], [0], [(256, 768)]),
])
def test_first_fit_table(ops, expected_offsets, expected_free) -> None:
    alloc = OffsetAllocator(1024, alignment=256)
    offsets: list[int | None] = []
    for op in ops:
        kind, arg = op.split()
        if kind == "a":
            offsets.append(alloc.alloc(int(arg)))
        else:
            alloc.free(offsets[int(arg)])  # type: ignore[arg-type]
    assert offsets == expected_offsets
    assert alloc.free_ranges() == expected_free


def test_double_free_is_refused() -> None:
    alloc = OffsetAllocator(1024)
    off = alloc.alloc(10)
    alloc.free(off)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not allocated"):
        alloc.free(off)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 3000)), max_size=60))
def test_live_ranges_never_overlap_and_everything_coalesces(steps) -> None:
    alloc = OffsetAllocator(16384, alignment=64)
    live: dict[int, int] = {}
    for do_alloc, n in steps:
        if do_alloc or not live:
            off = alloc.alloc(n)
            if off is None:
                assert alloc.largest_free < max(n, 1), "first fit missed a fitting hole"
                continue
            assert off % 64 == 0 and off + n <= 16384
            for other, m in live.items():
                assert off + max(n, 1) <= other or other + max(m, 1) <= off, "overlap"
            live[off] = n
        else:
            off = sorted(live)[n % len(live)]
            alloc.free(off)
            del live[off]
        assert alloc.used_bytes + sum(size for _, size in alloc.free_ranges()) == 16384
    for off in list(live):
        alloc.free(off)
    assert alloc.free_ranges() == [(0, 16384)]


def test_pool_reuses_segments_and_grows_rarely() -> None:
    calls: list[int] = []

    def allocate(n: int) -> torch.Tensor:
        calls.append(n)
        return torch.zeros(n, dtype=torch.uint8)

    pool = HostPool(4096, allocate, alignment=256)
    slots = [pool.alloc(1000) for _ in range(4)]  # 4 x 1024 fills the first segment
    assert calls == [4096]
    for i, slot in enumerate(slots):
        slot.view.fill_(i + 1)
    assert [int(s.view[0]) for s in slots] == [1, 2, 3, 4], "slots must not share bytes"
    for slot in slots:
        pool.free(slot)
    for _ in range(10):  # freed space is reused, no new segment
        pool.free(pool.alloc(4000))
    assert calls == [4096]
    big = pool.alloc(10_000)  # does not fit: one new segment for the aligned size (10240)
    assert calls == [4096, 10_240] and big.segment == 1 and big.view.numel() == 10_000
    small = pool.alloc(5000)  # fits neither: a segment twice the largest so far
    assert calls == [4096, 10_240, 20_480] and small.segment == 2
    assert pool.used_bytes == 10_240 + 5_120 and pool.capacity == 4096 + 10_240 + 20_480


class _Segments:
    """An allocate/release pair that records what the pool asked for and gave back."""

    def __init__(self) -> None:
        self.made: list[int] = []
        self.released: list[int] = []

    def allocate(self, n: int) -> torch.Tensor:
        self.made.append(n)
        return torch.zeros(n, dtype=torch.uint8)

    def release(self, buffer: torch.Tensor) -> None:
        self.released.append(buffer.numel())


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 50_000), min_size=1, max_size=40))
def test_a_reserved_pool_never_grows_over_two_steps_and_wastes_only_alignment(sizes) -> None:
    """A pool reserved for a plan's offloads (sum of aligned sizes) holds one segment of
    exactly that size; two steps of those offloads (each slot freed at the end of the step,
    as the CUDA device does after drop_host) fit it with no growth, and the bytes held over
    the bytes in use are at most 1 + 63 x offloads / host peak."""
    seg = _Segments()
    pool = HostPool(1 << 20, seg.allocate, alignment=64, release=seg.release)
    reserved = sum(align_up(n, 64) for n in sizes)
    pool.reserve(reserved)
    assert seg.made == [reserved]
    for _ in range(2):
        slots = [pool.alloc(n) for n in sizes]
        assert all(s.view.numel() == n for s, n in zip(slots, sizes, strict=True))
        for s in slots:
            pool.free(s)
    assert seg.made == [reserved], "the pool grew during a planned step"
    assert pool.peak_used == reserved
    assert pool.capacity / sum(sizes) <= 1 + 63 * len(sizes) / sum(sizes)
    pool.reserve(reserved)  # already has the room: nothing new
    assert seg.made == [reserved]
    pool.close()
    assert seg.released == [reserved] and pool.capacity == 0


def test_pool_limit_is_enforced_and_growth_is_capped_to_fit() -> None:
    from outcore.host import HostOutOfMemory

    seg = _Segments()
    pool = HostPool(4096, seg.allocate, alignment=64, limit=4096 + 2048)
    pool.alloc(4096)
    pool.alloc(1000)  # doubling would take 8192 > limit: grows by the aligned request only
    assert seg.made == [4096, 1024]
    with pytest.raises(HostOutOfMemory, match=r"host memory.*host_budget="):
        pool.alloc(2000)
    assert seg.made == [4096, 1024], "a refused growth must not allocate"


def test_overhead_is_held_over_peak_used() -> None:
    seg = _Segments()
    pool = HostPool(1000, seg.allocate, alignment=100)
    assert pool.overhead() == float("inf")
    a = pool.alloc(250)  # 300 bytes
    b = pool.alloc(100)
    pool.free(a)
    pool.free(b)
    assert pool.peak_used == 400 and pool.overhead() == 1000 / 400
