"""EmulatedDevice on its own: round trips, memory accounting, capacity, errors, close."""

from __future__ import annotations

import gc

import pytest
import torch

from outcore.errors import DeviceOutOfMemory, OutcoreError, ScheduleError
from outcore.runtime.devices import emulated
from outcore.runtime.devices.base import Device
from outcore.runtime.devices.copy_engine import CopyError
from outcore.runtime.devices.storage import byte_view


def _storage_bytes(t: torch.Tensor) -> torch.Tensor:
    return byte_view(t.untyped_storage()).clone()


def _tensors() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-45])
    base = torch.randn(6, 10, generator=gen)
    return {
        "float32": torch.cat([torch.randn(1000, generator=gen), special]),
        "float16": torch.randn(33, 7, generator=gen).half(),
        "bfloat16": torch.randn(129, generator=gen).bfloat16(),
        "float64": torch.randn(5, 5, generator=gen).double(),
        "int64": torch.randint(-2**62, 2**62, (257,), generator=gen, dtype=torch.int64),
        "int8": torch.randint(-128, 127, (100,), generator=gen, dtype=torch.int8),
        "uint8": torch.randint(0, 255, (100,), generator=gen, dtype=torch.uint8),
        "bool": torch.rand(77, generator=gen) > 0.5,
        "transposed": base.t(),
        "strided_offset": base.as_strided((3, 4), (20, 2), 5),
        "channels_last": torch.randn(2, 3, 4, 5, generator=gen).to(
            memory_format=torch.channels_last),
        "scalar": torch.tensor(3.25),
        "empty": torch.empty(0, 4),
    }


@pytest.mark.parametrize("kind", list(_tensors()))
def test_offloaded_data_comes_back_bit_identical(make_emulated, kind: str) -> None:
    dev = make_emulated(bw=200e6)
    original = _tensors()[kind]
    before = _storage_bytes(original)
    dev.start_offload(5, original, name=kind)
    dev.wait_offload(5)
    back = dev.start_prefetch(5, kind)
    dev.wait_prefetch(5)
    assert (back.dtype, back.shape, back.stride(), back.storage_offset()) == (
        original.dtype, original.shape, original.stride(), original.storage_offset())
    assert torch.equal(_storage_bytes(back), before), "raw bytes differ after the round trip"
    assert back.untyped_storage()._cdata != original.untyped_storage()._cdata, "not a copy"


def test_satisfies_the_device_protocol(make_emulated) -> None:
    assert isinstance(make_emulated(), Device)


def test_host_copies_are_not_device_memory_and_prefetches_are(make_emulated) -> None:
    dev = make_emulated()
    x = torch.randn(256, 64)
    nbytes = x.untyped_storage().nbytes()
    with dev.tracker:
        dev.tracker.track([x], "x")
        dev.start_offload(1, x)
        dev.wait_offload(1)
        assert dev.tracker.live == nbytes, "the host copy must not be counted"
        assert dev.host_bytes() == nbytes
        back = dev.start_prefetch(1, "x again")
        assert dev.tracker.live == 2 * nbytes
        assert dev.tracker.allocations == 2, "a prefetch is exactly one allocation"
        dev.wait_prefetch(1)
        del x  # the finished D2H copy must not keep the source alive
        gc.collect()
        assert dev.tracker.live == nbytes
        del back  # nor the finished H2D copy its destination
        gc.collect()
        assert dev.tracker.live == 0
    dev.drop_host(1)
    assert dev.host_bytes() == 0


def test_capacity_overflow_names_tensor_and_keeps_live_bytes(make_emulated) -> None:
    dev = make_emulated(capacity=10_000)
    x = torch.zeros(1500, dtype=torch.float32)  # 6000 bytes
    dev.start_offload(3, x)
    dev.wait_offload(3)
    with dev.tracker:
        dev.tracker.track([x], "x")
        allocations = dev.tracker.allocations
        with pytest.raises(DeviceOutOfMemory) as info:
            dev.start_prefetch(3, "conv1.out")
        assert dev.tracker.live == 6000
        assert dev.tracker.allocations == allocations
    err = info.value
    assert (err.tensor, err.wanted, err.free) == ("conv1.out", 6000, 4000)
    assert "conv1.out" in str(err) and "6000" in str(err) and "4000" in str(err)
    del x
    gc.collect()
    with dev.tracker:  # with room again, the same prefetch succeeds
        back = dev.start_prefetch(3, "conv1.out")
        dev.wait_prefetch(3)
        assert dev.tracker.live == 6000
    assert torch.count_nonzero(back) == 0


def test_host_failure_on_copy_thread_surfaces_on_wait(make_emulated, monkeypatch) -> None:
    def no_host_memory(nbytes: int) -> torch.Tensor:
        raise MemoryError(f"cannot pin {nbytes} bytes of host memory")

    monkeypatch.setattr(emulated, "allocate_host", no_host_memory)
    dev = make_emulated()
    dev.start_offload(11, torch.ones(100), name="fc.weight.grad")
    with pytest.raises(CopyError, match=r"d2h copy of 'fc.weight.grad' \(tensor 11\)") as info:
        dev.wait_offload(11)
    assert isinstance(info.value.__cause__, MemoryError)
    assert info.value.tid == 11
    # a prefetch of that tensor depends on the failed offload and fails too
    dev.start_prefetch(11, "fc.weight.grad")
    with pytest.raises(CopyError, match=r"h2d copy of 'fc\.weight\.grad'"):
        dev.wait_prefetch(11)
    assert dev.stats().d2h.failed == 1 and dev.stats().h2d.failed == 1
    dev.synchronize()  # both failures were already reported by their waits


def test_synchronize_reports_unwaited_failures(make_emulated, monkeypatch) -> None:
    monkeypatch.setattr(emulated, "allocate_host",
                        lambda n: (_ for _ in ()).throw(MemoryError("host full")))
    dev = make_emulated()
    dev.start_offload(4, torch.ones(10))
    with pytest.raises(CopyError, match="tensor 4"):
        dev.synchronize()
    dev.synchronize()  # reported once


def test_waits_and_prefetches_without_a_start_are_schedule_errors(make_emulated) -> None:
    dev = make_emulated()
    with pytest.raises(ScheduleError, match="Offload must come before"):
        dev.wait_offload(1)
    with pytest.raises(ScheduleError, match="Prefetch must follow"):
        dev.start_prefetch(1, "a")
    dev.start_offload(1, torch.ones(3))
    with pytest.raises(ScheduleError, match="Prefetch must come before"):
        dev.wait_prefetch(1)


def test_close_stops_threads_and_aborts_copies(make_emulated) -> None:
    dev = make_emulated(bw=1e3)  # 4 KB at 1 KB/s: would take 4 s
    assert not dev.threads_running, "threads start lazily"
    dev.start_offload(1, torch.ones(1024))
    assert dev.threads_running
    dev.close()
    assert not dev.threads_running
    with pytest.raises(CopyError, match="closed"):
        dev.wait_offload(1)
    with pytest.raises(OutcoreError, match="closed"):
        dev.start_offload(2, torch.ones(3))


def test_context_manager_and_garbage_collection_stop_threads(make_emulated) -> None:
    with emulated.EmulatedDevice(None, 1e9, 1e9) as dev:
        dev.start_offload(1, torch.ones(8))
        dev.wait_offload(1)
        assert dev.threads_running
    assert not dev.threads_running
    dropped = emulated.EmulatedDevice(None, 1e9, 1e9)
    dropped.start_offload(1, torch.ones(8))
    engines = list(dropped._engines.values())
    del dropped
    gc.collect()
    assert not any(e.running for e in engines)


def test_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError, match="bandwidth"):
        emulated.EmulatedDevice(None, 0.0, 1e9)
    with pytest.raises(ValueError, match="slowdown"):
        emulated.EmulatedDevice(None, 1e9, 1e9, slowdown=0)
    with pytest.raises(ValueError, match="capacity"):
        emulated.EmulatedDevice(-1, 1e9, 1e9)
