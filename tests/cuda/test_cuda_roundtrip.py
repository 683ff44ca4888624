"""Offload and prefetch on a GPU: bit-identical round trips, pinned slots, no host growth."""

from __future__ import annotations

import pytest
import torch

from outcore.runtime.devices.cuda import HOST_ALIGNMENT, CudaDevice
from outcore.runtime.devices.host_pool import align_up
from outcore.runtime.devices.storage import byte_view

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64,
          torch.int8, torch.bool, torch.complex64]


def _sample(dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(0)
    if dtype == torch.bool:
        return torch.rand(shape, device="cuda", generator=g) > 0.5
    if dtype.is_floating_point or dtype.is_complex:
        x = torch.randn(shape, device="cuda", generator=g, dtype=torch.float32).to(dtype)
        flat = x.view(-1)
        if dtype.is_floating_point:  # special values must survive too
            flat[:3] = torch.tensor([float("nan"), float("inf"), -0.0], dtype=dtype)
        return x
    return torch.randint(-100, 100, shape, device="cuda", generator=g).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip_is_bit_identical_views_and_all(dtype: torch.dtype) -> None:
    base = _sample(dtype, (8, 37, 5))
    views = {"whole": base, "transposed": base.transpose(0, 2), "offset": base[3:, 2:, 1],
             "strided": base[::2, ::3]}
    with CudaDevice() as dev:
        for tid, (label, t) in enumerate(views.items()):
            expected = byte_view(t.untyped_storage()).clone()
            with dev.tracker:
                dev.start_offload(tid, t, name=label)
                dev.wait_offload(tid)
                back = dev.start_prefetch(tid, label)
                dev.wait_prefetch(tid)
                assert dev.tracker.live == expected.numel(), "only the device copy is tracked"
            torch.cuda.synchronize()
            assert back.shape == t.shape and back.stride() == t.stride(), label
            assert back.storage_offset() == t.storage_offset(), label
            assert torch.equal(byte_view(back.untyped_storage()), expected), label
        assert dev.pool.alloc(1).view.is_pinned(), "host slots must be page-locked"


def test_host_pool_is_reserved_exactly_and_never_grows_over_steps() -> None:
    sizes = [1 << 20, 3 * (1 << 20) + 5, 4096, 777]
    tensors = [torch.randn(n // 4 + 1, device="cuda") for n in sizes]
    nbytes = [t.untyped_storage().nbytes() for t in tensors]
    with CudaDevice() as dev:
        reserved = dev.reserve_host(nbytes)
        assert reserved == sum(align_up(n, HOST_ALIGNMENT) for n in nbytes)
        assert dev.pool.segments_allocated == 1 and dev.pool.capacity == reserved
        for _step in range(3):
            for tid, t in enumerate(tensors):
                dev.start_offload(tid, t)
            for tid in range(len(tensors)):
                dev.wait_offload(tid)
                back = dev.start_prefetch(tid, f"t{tid}")
                dev.wait_prefetch(tid)
                torch.cuda.current_stream().synchronize()
                assert torch.equal(back, tensors[tid])
            dev.synchronize()
            for tid in range(len(tensors)):
                dev.drop_host(tid)
        assert dev.pool.segments_allocated == 1, "a planned step must not grow the pool"
        assert dev.pool.capacity / sum(nbytes) <= 1.05
        stats = dev.stats()
        assert stats.d2h.copies == stats.h2d.copies == 3 * len(tensors)
        assert stats.d2h.bytes == 3 * sum(nbytes) and stats.d2h.busy_s > 0


def test_a_slot_is_not_reused_while_its_copy_is_in_flight() -> None:
    """With the copy streams slowed, a re-offload of the same id must land in a new slot."""
    x = torch.arange(1 << 18, device="cuda", dtype=torch.float32)
    with CudaDevice(copy_delay_cycles=50_000_000) as dev:
        dev.start_offload(0, x)
        first = dev._host[0].slot
        dev.start_offload(0, x + 1)  # retires the first slot; its copy has not run yet
        second = dev._host[0].slot
        assert (first.segment, first.offset) != (second.segment, second.offset)
        dev.wait_offload(0)
        back = dev.start_prefetch(0, "x")
        dev.wait_prefetch(0)
        torch.cuda.synchronize()
        assert torch.equal(back, x + 1)


def test_a_closed_device_has_unpinned_its_pool_and_refuses_work() -> None:
    from outcore.errors import OutcoreError

    x = torch.ones(1024, device="cuda")
    dev = CudaDevice()
    assert dev.reserve_host([x.untyped_storage().nbytes()]) > 0
    dev.start_offload(0, x)
    dev.close()
    assert dev.pool.capacity == 0 and dev.host_bytes() == 0
    with pytest.raises(OutcoreError, match="closed"):
        dev.start_offload(1, x)
