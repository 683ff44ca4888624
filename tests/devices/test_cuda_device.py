"""CudaDevice: import-safe without CUDA; on a GPU, the same contract as the emulated device."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from outcore.errors import OutcoreError

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_importing_does_not_touch_cuda() -> None:
    code = ("import torch, outcore.runtime.devices.cuda as c, outcore.runtime.devices.factory;"
            "assert not torch.cuda.is_initialized(); print(c.CudaDevice.name)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "cuda"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
def test_construction_without_cuda_raises_a_clear_error() -> None:
    from outcore.runtime.devices.cuda import CudaDevice

    with pytest.raises(OutcoreError, match=r"is_available\(\) is False.*cpu-emulated"):
        CudaDevice()


@needs_cuda
def test_cuda_round_trip_is_bit_identical_and_tracked() -> None:
    from outcore.runtime.devices.base import Device
    from outcore.runtime.devices.cuda import CudaDevice

    with CudaDevice(host_pool_bytes=1 << 20) as dev:
        assert isinstance(dev, Device)
        x = torch.randn(64, 33, device="cuda").t()
        ref = x.clone()
        with dev.tracker:
            dev.start_offload(1, x, name="x")
            dev.wait_offload(1)
            del x  # record_stream keeps the block until the copy ran
            back = dev.start_prefetch(1, "x")
            assert dev.tracker.live == back.untyped_storage().nbytes()
            dev.wait_prefetch(1)
            assert torch.equal(back, ref) and back.stride() == ref.stride()
        dev.synchronize()
        stats = dev.stats()
        assert stats.d2h.copies == 1 and stats.h2d.copies == 1
        dev.drop_host(1)
        assert dev.host_bytes() == 0
