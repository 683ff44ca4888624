"""Hardware profiles: what a device can do, as data (plain Python, no torch).

The named GPU profiles live in ``gpus.json`` beside this module, each with the sources its
numbers come from. ``get_profile("this-cpu")`` measures the machine outcore runs on (lazily,
once per process, in ``outcore.cost.measure_host``, the only place here that imports torch).

Units inside a ``HardwareProfile`` are SI: bytes, bytes/s, FLOP/s, seconds. The JSON form
uses readable units (``"12GiB"``, TFLOP/s, GB/s, microseconds); ``from_dict``/``to_dict``
convert. Invariants (checked on construction, ``ProfileError`` naming the field otherwise):
memory > 0; every bandwidth and peak > 0 and finite; peaks are given for known dtypes only
and at least for ``float32``; ``copy_engines`` >= 1; ``launch_overhead`` >= 0.

The host the device sits in is described by two optional fields, used to price work that
runs on the CPU (the optimizer step of parameters held in host memory,
``outcore.weights.step_cost``): ``host_memory_bandwidth`` (bytes/s of the host's DRAM) and
``host_adam_rate`` (parameters per second of PyTorch's CPU AdamW step on that host). Every
catalogue entry gives both with its source; "this-cpu" measures both.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from types import MappingProxyType
from typing import Any

from outcore.errors import ProfileError
from outcore.graph.ir import OpCategory
from outcore.units import parse_bytes

#: Dtype names a profile may give a peak for (torch's names without "torch."; "tf32" is
#: float32 math on tensor cores).
KNOWN_DTYPES = frozenset({
    "float64", "float32", "tf32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "int8",
})

#: For a dtype a profile lacks, the dtypes that price it, nearest first (a GPU without
#: bfloat16 units runs bfloat16 math at its float32 rate; float8 and int8 on a GPU without
#: them fall back to its 16-bit units). Any other dtype is priced as float32, which every
#: profile has.
NEAREST_DTYPES: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "bfloat16": ("float32", "float16"),
    "float16": ("bfloat16", "float32"),
    "tf32": ("float32",),
    "float8_e4m3fn": ("float8_e5m2", "float16", "bfloat16"),
    "float8_e5m2": ("float8_e4m3fn", "float16", "bfloat16"),
    "int8": ("float16", "bfloat16"),
    "float64": ("float32",),
})

#: Name of the measured profile of this machine.
THIS_CPU = "this-cpu"

_JSON_KEYS = frozenset({
    "name", "aliases", "description", "memory", "peak_tflops", "memory_bandwidth_gbs", "link",
    "link_peak_gbs", "h2d_gbs", "d2h_gbs", "copy_engines", "launch_overhead_us", "sources",
    "efficiency", "shared_memory", "host_memory_bandwidth_gbs", "host_adam_mparams",
    "fill_time_us",
})
_REQUIRED = ("name", "memory", "peak_tflops", "memory_bandwidth_gbs", "h2d_gbs", "d2h_gbs",
             "copy_engines", "launch_overhead_us")


def _fail(profile: str, key: str, problem: str) -> ProfileError:
    return ProfileError(f"hardware profile {profile!r}: field {key!r} {problem}")


def _positive(profile: str, key: str, value: Any, *, allow_zero: bool = False) -> float:
    """``value`` as a float that is finite and > 0 (>= 0 with ``allow_zero``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(profile, key, f"must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise _fail(profile, key, f"must be a finite number {bound}, got {value!r}")
    return v


@dataclass(frozen=True)
class HardwareProfile:
    """One device: memory, peak FLOP/s per dtype, DRAM and host-link bandwidths.

    ``shared_memory``: device and host memory are the same memory (see the field).
    ``efficiency`` optionally overrides the cost model's per-category compute efficiencies
    (category name -> fraction of peak in (0, 1]) and ``"memory"`` for the memory term.
    """

    name: str
    memory: int
    peak_flops: Mapping[str, float] = field(hash=False)
    memory_bandwidth: float
    h2d_bandwidth: float
    d2h_bandwidth: float
    copy_engines: int
    launch_overhead: float
    description: str = ""
    link: str = ""
    link_peak_bandwidth: float | None = None
    sources: tuple[str, ...] = field(default=(), repr=False)
    aliases: tuple[str, ...] = ()
    efficiency: Mapping[str, float] = field(default_factory=dict, hash=False)
    #: the device's memory and the host's are one memory (this CPU): an offload moves bytes
    #: within the same RAM and frees nothing, so planners for this profile never offload
    shared_memory: bool = False
    #: the host's DRAM bandwidth, bytes/s (None: not given)
    host_memory_bandwidth: float | None = None
    #: parameters per second of torch's CPU AdamW step on the host (None: not given)
    host_adam_rate: float | None = None
    #: seconds of peak-rate work a heavy kernel loses filling the device, for the analytic
    #: cost model (None: its ``DEFAULT_FILL_TIME``, fitted on a V100 and a Maxwell Titan X)
    fill_time: float | None = None

    def __post_init__(self) -> None:
        n = self.name or "<unnamed>"
        if not isinstance(self.name, str) or not self.name:
            raise _fail(n, "name", "must be a non-empty string")
        if isinstance(self.memory, bool) or not isinstance(self.memory, int) or self.memory <= 0:
            raise _fail(n, "memory", f"must be a positive number of bytes, got {self.memory!r}")
        for key in ("memory_bandwidth", "h2d_bandwidth", "d2h_bandwidth"):
            _positive(n, key, getattr(self, key))
        _positive(n, "launch_overhead", self.launch_overhead, allow_zero=True)
        for key in ("link_peak_bandwidth", "host_memory_bandwidth", "host_adam_rate"):
            if getattr(self, key) is not None:
                _positive(n, key, getattr(self, key))
        if self.fill_time is not None:
            _positive(n, "fill_time", self.fill_time, allow_zero=True)
        engines = self.copy_engines
        if isinstance(engines, bool) or not isinstance(engines, int) or engines < 1:
            raise _fail(n, "copy_engines", f"must be an integer >= 1, got {engines!r}")
        object.__setattr__(self, "peak_flops", MappingProxyType(_check_peaks(n, self.peak_flops)))
        object.__setattr__(self, "efficiency",
                           MappingProxyType(_check_efficiency(n, self.efficiency)))
        object.__setattr__(self, "sources", tuple(self.sources))
        object.__setattr__(self, "aliases", tuple(self.aliases))

    # -- queries ---------------------------------------------------------------------------
    def peak(self, dtype: str) -> float:
        """Peak FLOP/s for ``dtype``. A dtype the profile gives no peak for is priced at the
        peak of its nearest dtype (``NEAREST_DTYPES``; bfloat16 on a V100 runs at its
        float32 rate), with a ``ProfileDtypeWarning`` once per profile and dtype: a
        missing number makes a plan approximate, never impossible."""
        key = dtype.removeprefix("torch.")
        if key in self.peak_flops:
            return self.peak_flops[key]
        return self.peak_flops[_nearest_priced(self.name, key, tuple(sorted(self.peak_flops)))]

    def bandwidth(self, direction: str) -> float:
        """Host-link bytes/s for ``direction`` ("h2d" or "d2h")."""
        if direction == "h2d":
            return self.h2d_bandwidth
        if direction == "d2h":
            return self.d2h_bandwidth
        raise ValueError(f"direction must be 'h2d' or 'd2h', got {direction!r}")

    # -- JSON form ---------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> HardwareProfile:
        """Read the JSON form (see gpus.json); ProfileError names a missing/bad field."""
        if not isinstance(doc, Mapping):
            raise ProfileError("a hardware profile must be a JSON object, "
                               f"got {type(doc).__name__}")
        raw_name = doc.get("name")
        name: str = raw_name if isinstance(raw_name, str) else "<unnamed>"
        for key in _REQUIRED:
            if key not in doc:
                raise _fail(name, key, "is missing")
        unknown = sorted(set(doc) - _JSON_KEYS)
        if unknown:
            raise _fail(name, unknown[0],
                        f"is not a profile field; known fields: {sorted(_JSON_KEYS)}")
        try:
            memory = parse_bytes(doc["memory"])
        except ValueError as exc:
            raise _fail(name, "memory", str(exc)) from None
        if memory <= 0:
            raise _fail(name, "memory", f"must be > 0 bytes, got {doc['memory']!r}")
        peaks = doc["peak_tflops"]
        if not isinstance(peaks, Mapping):
            raise _fail(name, "peak_tflops", "must map dtype names to TFLOP/s")
        link_peak = doc.get("link_peak_gbs")
        host_bw = doc.get("host_memory_bandwidth_gbs")
        host_adam = doc.get("host_adam_mparams")
        fill = doc.get("fill_time_us")
        return cls(
            name=name,
            memory=memory,
            peak_flops={k: _positive(name, f"peak_tflops.{k}", v) * 1e12 for k, v in peaks.items()},
            memory_bandwidth=_positive(name, "memory_bandwidth_gbs",
                                       doc["memory_bandwidth_gbs"]) * 1e9,
            h2d_bandwidth=_positive(name, "h2d_gbs", doc["h2d_gbs"]) * 1e9,
            d2h_bandwidth=_positive(name, "d2h_gbs", doc["d2h_gbs"]) * 1e9,
            copy_engines=doc["copy_engines"],
            launch_overhead=_positive(name, "launch_overhead_us", doc["launch_overhead_us"],
                                      allow_zero=True) * 1e-6,
            description=str(doc.get("description", "")),
            link=str(doc.get("link", "")),
            link_peak_bandwidth=None if link_peak is None
            else _positive(name, "link_peak_gbs", link_peak) * 1e9,
            sources=tuple(doc.get("sources", ())),
            aliases=tuple(doc.get("aliases", ())),
            efficiency=dict(doc.get("efficiency", {})),
            shared_memory=doc.get("shared_memory", False) is True,
            host_memory_bandwidth=None if host_bw is None
            else _positive(name, "host_memory_bandwidth_gbs", host_bw) * 1e9,
            host_adam_rate=None if host_adam is None
            else _positive(name, "host_adam_mparams", host_adam) * 1e6,
            fill_time=None if fill is None
            else _positive(name, "fill_time_us", fill, allow_zero=True) * 1e-6,
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON form; ``from_dict(p.to_dict())`` equals ``p`` up to float rounding of
        the unit conversions."""
        doc: dict[str, Any] = {
            "name": self.name,
            "aliases": list(self.aliases),
            "description": self.description,
            "memory": self.memory,
            "peak_tflops": {k: v / 1e12 for k, v in self.peak_flops.items()},
            "memory_bandwidth_gbs": self.memory_bandwidth / 1e9,
            "link": self.link,
            "h2d_gbs": self.h2d_bandwidth / 1e9,
            "d2h_gbs": self.d2h_bandwidth / 1e9,
            "copy_engines": self.copy_engines,
            "launch_overhead_us": self.launch_overhead * 1e6,
            "sources": list(self.sources),
        }
        if self.link_peak_bandwidth is not None:
            doc["link_peak_gbs"] = self.link_peak_bandwidth / 1e9
        if self.efficiency:
            doc["efficiency"] = dict(self.efficiency)
        if self.shared_memory:
            doc["shared_memory"] = True
        if self.host_memory_bandwidth is not None:
            doc["host_memory_bandwidth_gbs"] = self.host_memory_bandwidth / 1e9
        if self.host_adam_rate is not None:
            doc["host_adam_mparams"] = self.host_adam_rate / 1e6
        if self.fill_time is not None:
            doc["fill_time_us"] = self.fill_time * 1e6
        return doc


@cache
def _nearest_priced(profile: str, dtype: str, priced: tuple[str, ...]) -> str:
    """The dtype that prices ``dtype`` on ``profile`` (which gives peaks for ``priced``);
    announced once per profile and dtype (the cache), as a ``ProfileDtypeWarning``."""
    from outcore.errors import ProfileDtypeWarning
    from outcore.log import announce

    chosen = next((d for d in NEAREST_DTYPES.get(dtype, ()) if d in priced), "float32")
    announce(f"hardware profile {profile!r} gives no peak for dtype {dtype!r}; pricing it at "
             f"the {chosen} peak (add peak_tflops.{dtype} to the profile for exact times)",
             ProfileDtypeWarning, stacklevel=4)
    return chosen


def _check_peaks(name: str, peaks: Mapping[str, float]) -> dict[str, float]:
    if not isinstance(peaks, Mapping) or not peaks:
        raise _fail(name, "peak_flops", "must map at least 'float32' to FLOP/s")
    out: dict[str, float] = {}
    for dtype, value in peaks.items():
        key = str(dtype).removeprefix("torch.")
        if key not in KNOWN_DTYPES:
            raise _fail(name, f"peak_flops.{key}",
                        f"names an unknown dtype; use one of {sorted(KNOWN_DTYPES)}")
        out[key] = _positive(name, f"peak_flops.{key}", value)
    if "float32" not in out:
        raise _fail(name, "peak_flops.float32", "is missing (every profile needs a float32 peak)")
    return out


def _check_efficiency(name: str, eff: Mapping[str, float]) -> dict[str, float]:
    allowed = {c.value for c in OpCategory} | {"memory"}
    out: dict[str, float] = {}
    for key, value in dict(eff).items():
        if key not in allowed:
            raise _fail(name, f"efficiency.{key}",
                        f"is not an op category; use one of {sorted(allowed)}")
        v = _positive(name, f"efficiency.{key}", value)
        if v > 1:
            raise _fail(name, f"efficiency.{key}",
                        f"is a fraction of peak and must be <= 1, got {value}")
        out[key] = v
    return out


# -- the catalogue -----------------------------------------------------------------------------
def load_profiles(text: str) -> dict[str, HardwareProfile]:
    """Parse a profiles document (the gpus.json format) into name -> profile."""
    try:
        doc = json.loads(text)
        entries = doc["profiles"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ProfileError(f"not a hardware-profiles document: {exc}") from exc
    result: dict[str, HardwareProfile] = {}
    for entry in entries:
        profile = HardwareProfile.from_dict(entry)
        if profile.name in result or profile.name == THIS_CPU:
            raise ProfileError(f"hardware profile {profile.name!r} is defined twice")
        result[profile.name] = profile
    return result


@cache
def _catalogue() -> dict[str, HardwareProfile]:
    text = resources.files("outcore.cost").joinpath("gpus.json").read_text(encoding="utf-8")
    return load_profiles(text)


def _resolve(name: str) -> str:
    key = name.strip().lower()
    catalogue = _catalogue()
    if key in catalogue or key == THIS_CPU:
        return key
    for profile in catalogue.values():
        if key in profile.aliases:
            return profile.name
    raise ProfileError(f"unknown hardware profile {name!r}; known: "
                       f"{[*sorted(catalogue), THIS_CPU]} (aliases: "
                       f"{sorted(a for p in catalogue.values() for a in p.aliases)})")


def get_profile(name: str) -> HardwareProfile:
    """The profile called ``name`` (or one of its aliases, case-insensitive).

    ``"this-cpu"`` is measured on first use (about a second) and cached for the process.
    """
    key = _resolve(name)
    if key == THIS_CPU:
        from outcore.cost.measure_host import measure_this_cpu

        return measure_this_cpu()
    return _catalogue()[key]


def profiles(*, include_measured: bool = False) -> dict[str, HardwareProfile]:
    """Every named profile, by name. ``include_measured`` adds "this-cpu" (measuring it)."""
    result = dict(_catalogue())
    if include_measured:
        result[THIS_CPU] = get_profile(THIS_CPU)
    return result


def profile_names() -> list[str]:
    """Names ``get_profile`` accepts (without aliases), "this-cpu" last; measures nothing."""
    return [*sorted(_catalogue()), THIS_CPU]


# -- multi-GPU hosts and interconnects (data parallel; defined in outcore.cost.interconnects) --
from outcore.cost.interconnects import (  # noqa: E402 - needs the names above
    HOSTS,
    INTERCONNECTS,
    HostProfile,
    Interconnect,
    get_host,
    get_interconnect,
)

__all__ = ["HOSTS", "INTERCONNECTS", "HardwareProfile", "HostProfile", "Interconnect",
           "get_host", "get_interconnect", "get_profile", "load_profiles", "profile_names",
           "profiles"]
