"""make_device: names to devices, and options refused where they do not apply."""

from __future__ import annotations

import pytest
import torch

from outcore.errors import OutcoreError
from outcore.runtime.devices.base import Device, SyncCPUDevice
from outcore.runtime.devices.emulated import EmulatedDevice
from outcore.runtime.devices.factory import DEVICES, make_device


def test_cpu() -> None:
    dev = make_device("cpu", capacity="1KiB")
    assert isinstance(dev, SyncCPUDevice) and isinstance(dev, Device)
    assert dev.tracker.capacity == 1024


def test_cpu_emulated_with_bandwidth() -> None:
    with make_device("cpu-emulated", capacity=4096, bandwidth=(2e6, 3e6), slowdown=2.0) as dev:
        assert isinstance(dev, EmulatedDevice) and isinstance(dev, Device)
        assert dev.capacity == 4096
        assert dev.link("d2h").bandwidth == 2e6 and dev.link("h2d").bandwidth == 3e6
        assert dev.link("d2h").slowdown == 2.0
    with make_device("cpu-emulated", bandwidth=5e6) as dev:
        assert dev.link("d2h").bandwidth == dev.link("h2d").bandwidth == 5e6


def test_cpu_emulated_from_a_gpu_profile() -> None:
    pytest.importorskip("outcore.cost.profiles")
    from outcore.runtime.devices.bandwidth import bandwidth_for_gpu

    with make_device("cpu-emulated", gpu="v100-nvlink") as dev:
        d2h, h2d = bandwidth_for_gpu("v100-nvlink")  # the same cached CPU measurement
        assert dev.link("d2h").bandwidth == pytest.approx(d2h)
        assert dev.link("h2d").bandwidth == pytest.approx(h2d)


def test_unknown_device_lists_the_choices() -> None:
    with pytest.raises(ValueError) as info:
        make_device("tpu")
    assert all(name in str(info.value) for name in DEVICES)


@pytest.mark.parametrize("device, kw, refused", [
    ("cpu", {"gpu": "v100-pcie"}, "gpu"),
    ("cpu", {"bandwidth": 1e9}, "bandwidth"),
    ("cuda", {"slowdown": 3.0}, "slowdown"),
    ("cpu-emulated", {"gpu": "v100-pcie", "bandwidth": 1e9}, "not both"),
    ("cpu-emulated", {"bandwidth": (1e9,)}, "pair"),
])
def test_options_that_do_not_apply_are_refused(device, kw, refused) -> None:
    with pytest.raises(ValueError, match=refused):
        make_device(device, **kw)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
def test_cuda_without_a_gpu_says_what_to_use() -> None:
    with pytest.raises(OutcoreError, match="cpu-emulated"):
        make_device("cuda")
