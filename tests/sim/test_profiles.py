"""Hardware profiles: the catalogue, its JSON form, and refusal of impossible values."""

from __future__ import annotations

import json
import math

import pytest

from outcore.cost.profiles import (
    KNOWN_DTYPES,
    HardwareProfile,
    _nearest_priced,
    get_profile,
    load_profiles,
    profile_names,
    profiles,
)
from outcore.errors import ProfileDtypeWarning, ProfileError

NAMES = ["k40c", "titan-x-maxwell", "titan-xp", "v100-pcie", "v100-nvlink", "a100-40gb",
         "a100-80gb", "h100", "h200"]


def good_doc(**changes: object) -> dict:
    doc = {"name": "toy", "memory": "8GiB", "peak_tflops": {"float32": 10.0},
           "memory_bandwidth_gbs": 500.0, "h2d_gbs": 12.0, "d2h_gbs": 11.0,
           "copy_engines": 2, "launch_overhead_us": 5.0}
    doc.update(changes)
    return doc


def test_catalogue_has_every_named_gpu_with_sources() -> None:
    catalogue = profiles()
    assert sorted(catalogue) == sorted(NAMES)
    assert profile_names()[-1] == "this-cpu"
    for name, p in catalogue.items():
        assert p.sources, f"{name} documents no source"
        assert p.peak("float32") > 1e12 and p.memory >= 12 * 2**30
        assert p.h2d_bandwidth < p.memory_bandwidth


def test_published_figures_are_what_the_papers_say() -> None:
    v100, nvlink = get_profile("v100-pcie"), get_profile("v100-nvlink")
    assert v100.memory == nvlink.memory == 16 * 2**30
    assert v100.link_peak_bandwidth == 16e9 and v100.h2d_bandwidth == 12e9   # PoocH Table 1
    assert nvlink.link_peak_bandwidth == 75e9                                  # PoocH Table 2
    titan = get_profile("titan-x-maxwell")
    assert titan.h2d_bandwidth == 12.8e9 and titan.memory_bandwidth == 336.5e9  # vDNN
    assert get_profile("K40m") is get_profile("k40c")                           # alias, any case


def test_json_round_trip() -> None:
    for p in profiles().values():
        assert HardwareProfile.from_dict(json.loads(json.dumps(p.to_dict()))) == p


def test_unknown_profile_lists_the_known_ones() -> None:
    with pytest.raises(ProfileError, match="v100-pcie"):
        get_profile("v101")


@pytest.mark.parametrize("changes, field", [
    ({"h2d_gbs": -3.0}, "h2d_gbs"),
    ({"d2h_gbs": 0}, "d2h_gbs"),
    ({"memory_bandwidth_gbs": float("nan")}, "memory_bandwidth_gbs"),
    ({"memory": 0}, "memory"),
    ({"memory": "lots"}, "memory"),
    ({"peak_tflops": {"float32": 10.0, "float7": 3.0}}, "peak_flops.float7"),
    ({"peak_tflops": {"float16": 10.0}}, "peak_flops.float32"),
    ({"peak_tflops": {"float32": -1.0}}, "peak_tflops.float32"),
    ({"copy_engines": 0}, "copy_engines"),
    ({"copy_engines": 1.5}, "copy_engines"),
    ({"launch_overhead_us": -1}, "launch_overhead_us"),
    ({"efficiency": {"conv": 1.5}}, "efficiency.conv"),
    ({"efficiency": {"convolution": 0.5}}, "efficiency.convolution"),
    ({"bandwith_gbs": 3}, "bandwith_gbs"),
    ({"fill_time_us": -2}, "fill_time_us"),
])
def test_impossible_fields_are_refused_by_name(changes: dict, field: str) -> None:
    with pytest.raises(ProfileError, match=f"'{field}'"):
        HardwareProfile.from_dict(good_doc(**changes))


@pytest.mark.parametrize("missing", ["memory", "peak_tflops", "h2d_gbs", "copy_engines"])
def test_missing_fields_are_refused_by_name(missing: str) -> None:
    doc = good_doc()
    del doc[missing]
    with pytest.raises(ProfileError, match=f"'{missing}'.*missing"):
        HardwareProfile.from_dict(doc)


def test_direct_construction_is_checked_too() -> None:
    with pytest.raises(ProfileError, match="'h2d_bandwidth'"):
        HardwareProfile("x", 1 << 30, {"float32": 1e12}, 1e11, -1.0, 1e9, 2, 0.0)
    with pytest.raises(ProfileError, match="'memory'"):
        HardwareProfile("x", 0, {"float32": 1e12}, 1e11, 1e9, 1e9, 2, 0.0)


def test_peak_of_an_unpriced_dtype_is_the_nearest_priced_one_and_says_what_to_add() -> None:
    _nearest_priced.cache_clear()  # the warning is given once per process
    v100 = get_profile("v100-pcie")
    with pytest.warns(ProfileDtypeWarning, match=r"peak_tflops\.bfloat16"):
        assert v100.peak("torch.bfloat16") == v100.peak("float32")  # no bf16 units on Volta
    with pytest.warns(ProfileDtypeWarning, match="float8_e4m3fn"):
        assert v100.peak("float8_e4m3fn") == v100.peak("float16")


@pytest.mark.parametrize("name", ["a100-40gb", "a100-80gb", "h100", "h200"])
def test_every_shipped_profile_of_a_bf16_gpu_prices_bf16(name: str) -> None:
    """Ampere and later have bfloat16 units: their profiles must say how fast."""
    assert "bfloat16" in get_profile(name).peak_flops
    assert get_profile("h100").peak("torch.bfloat16") == pytest.approx(989.4e12)


def test_duplicate_profiles_in_a_document_are_refused() -> None:
    text = json.dumps({"profiles": [good_doc(), good_doc()]})
    with pytest.raises(ProfileError, match="twice"):
        load_profiles(text)


def test_this_cpu_is_measured_and_valid() -> None:
    p = get_profile("this-cpu")
    assert p is get_profile("THIS-CPU")  # measured once per process
    assert set(p.peak_flops) <= KNOWN_DTYPES and p.copy_engines == 2
    for value in (p.peak("float32"), p.memory_bandwidth, p.h2d_bandwidth, p.launch_overhead):
        assert math.isfinite(value) and value > 0
    again = HardwareProfile.from_dict(p.to_dict()).to_dict()
    for key, value in p.to_dict().items():
        assert again[key] == (pytest.approx(value) if isinstance(value, (int, float, dict))
                              else value), key
