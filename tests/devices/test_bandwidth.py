"""Emulated link bandwidth from a GPU's link and compute speeds."""

from __future__ import annotations

import math

import pytest
import torch

from outcore.cost.profiles import _nearest_priced
from outcore.errors import ProfileDtypeWarning, ProfileError
from outcore.runtime.devices.bandwidth import (
    bandwidth_for_gpu,
    cpu_flops,
    emulated_bandwidth,
)


@pytest.mark.parametrize("link, gpu, cpu, expected", [
    (12e9, 14e12, 14e12, 12e9),       # a CPU as fast as the GPU keeps the link as is
    (12e9, 14e12, 14e10, 12e7),       # 100x slower compute -> 100x slower link
    (60e9, 15e12, 3e10, 12e7),
])
def test_keeps_the_compute_to_transfer_ratio(link, gpu, cpu, expected) -> None:
    bw = emulated_bandwidth(link, gpu, cpu)
    assert bw == pytest.approx(expected)
    # same ratio: moving B bytes vs F FLOPs takes the same share of time on both machines
    assert (1e9 / bw) / (1e12 / cpu) == pytest.approx((1e9 / link) / (1e12 / gpu))


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_rejects_impossible_numbers(bad) -> None:
    with pytest.raises(ValueError):
        emulated_bandwidth(bad, 1e12, 1e10)
    with pytest.raises(ValueError):
        emulated_bandwidth(1e9, bad, 1e10)
    with pytest.raises(ValueError):
        emulated_bandwidth(1e9, 1e12, bad)


def test_cpu_flops_is_measured_once_per_process() -> None:
    first = cpu_flops(torch.float32, 128, 2)
    hits = cpu_flops.cache_info().hits
    assert cpu_flops(torch.float32, 128, 2) == first
    assert cpu_flops.cache_info().hits == hits + 1
    assert 1e6 < first < 1e15, f"{first} FLOP/s is not a plausible CPU matmul rate"


def test_bandwidth_for_gpu_uses_the_profile() -> None:
    profiles = pytest.importorskip("outcore.cost.profiles")
    v100 = profiles.get_profile("v100-pcie")
    d2h, h2d = bandwidth_for_gpu("v100-pcie", cpu=1e11)
    assert d2h == pytest.approx(v100.bandwidth("d2h") * 1e11 / v100.peak("float32"))
    assert h2d == pytest.approx(v100.bandwidth("h2d") * 1e11 / v100.peak("float32"))
    # NVLink moves more bytes per FLOP than PCIe: the emulated link is faster too
    assert bandwidth_for_gpu("v100-nvlink", cpu=1e11)[1] > h2d


def test_bandwidth_for_gpu_names_missing_data() -> None:
    pytest.importorskip("outcore.cost.profiles")
    with pytest.raises(ProfileError, match="no-such-gpu"):
        bandwidth_for_gpu("no-such-gpu", cpu=1e11)
    _nearest_priced.cache_clear()  # the warning is given once per process
    with pytest.warns(ProfileDtypeWarning, match="float8_e4m3fn"):  # priced, not refused
        priced = bandwidth_for_gpu("v100-pcie", dtype="float8_e4m3fn", cpu=1e11)
    assert priced == bandwidth_for_gpu("v100-pcie", dtype="float16", cpu=1e11)
