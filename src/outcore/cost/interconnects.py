"""Multi-GPU hosts as data: the interconnects between GPUs and the host link they share.

Plain Python (no torch), re-exported by ``outcore.cost.profiles``. Units are SI (bytes/s,
seconds). Two kinds of entry:

* ``Interconnect``: what an all-reduce runs on: ``bandwidth`` is the *bus bandwidth* a ring
  all-reduce reaches per GPU (NCCL's ``busbw``: a ring moves ``2 (n-1)/n`` times the buffer
  through every GPU's link), ``latency`` the cost of one ring step;
* ``HostProfile``: a machine with ``gpus_per_host`` GPUs of the named GPU profile, whose
  host<->device copies go through uplinks shared by ``gpus_per_link`` GPUs at
  ``link_bandwidth`` each way (a PCIe switch's x16 uplink to the CPU), GPUs joined by the
  ``interconnect`` inside the host and by ``network`` (per host, each way) between hosts.

The host CPU is shared too: ``host_adam_rate`` / ``host_memory_bandwidth`` (optional; the
host's CPU AdamW parameters/s and DRAM bytes/s, with their source in the description) are
the whole machine's; ``host_side`` gives one of ``n_gpus`` lock-step ranks its share (the
ranks on one host step their host-held parameters at the same time).

The shared-link rule (``copy_bandwidth``): ``k`` ranks behind one uplink that copy at once
get ``min(own, link / k)`` each. Data-parallel ranks run the same schedule in lock step, so
their copies do coincide; that is the rule the planner and the simulator use for every rank
(ranks fill uplinks in order: ranks 0..gpus_per_link-1 share the first).

Numbers are nominal rates with the usual practical derating (written per entry, with the
source); they are assumptions of the model, not measurements of this machine.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from outcore.cost.profiles import HardwareProfile, get_profile
from outcore.errors import ProfileError


@dataclass(frozen=True)
class Interconnect:
    """A link an all-reduce runs on; ``bandwidth`` is per GPU (bus bandwidth), bytes/s."""

    name: str
    bandwidth: float
    latency: float
    description: str = ""

    def __post_init__(self) -> None:
        if not (self.bandwidth > 0 and math.isfinite(self.bandwidth)):
            raise ProfileError(f"interconnect {self.name!r}: bandwidth must be > 0, "
                               f"got {self.bandwidth!r}")
        if not (self.latency >= 0 and math.isfinite(self.latency)):
            raise ProfileError(f"interconnect {self.name!r}: latency must be >= 0, "
                               f"got {self.latency!r}")


@dataclass(frozen=True)
class HostProfile:
    """A multi-GPU machine (module doc)."""

    name: str
    gpu: str
    gpus_per_host: int
    gpus_per_link: int
    link_bandwidth: float
    interconnect: str
    network: str
    description: str = ""
    host_memory_bandwidth: float | None = None
    host_adam_rate: float | None = None

    def __post_init__(self) -> None:
        for key in ("host_memory_bandwidth", "host_adam_rate"):
            value = getattr(self, key)
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise ProfileError(f"host profile {self.name!r}: {key} must be > 0, "
                                   f"got {value!r}")
        for key in ("gpus_per_host", "gpus_per_link"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ProfileError(f"host profile {self.name!r}: {key} must be an integer "
                                   f">= 1, got {value!r}")
        if not (self.link_bandwidth > 0 and math.isfinite(self.link_bandwidth)):
            raise ProfileError(f"host profile {self.name!r}: link_bandwidth must be > 0")
        for key in ("interconnect", "network"):
            if getattr(self, key) not in INTERCONNECTS:
                raise ProfileError(f"host profile {self.name!r}: unknown {key} "
                                   f"{getattr(self, key)!r}; known: {sorted(INTERCONNECTS)}")

    def sharing(self, n_gpus: int) -> int:
        """How many of ``n_gpus`` ranks (filled in order) share the busiest uplink."""
        return min(self.gpus_per_link, self.gpus_per_host, max(1, n_gpus))

    def copy_bandwidth(self, own: float, n_gpus: int) -> float:
        """Bytes/s one rank's copy engine gets when all ``n_gpus`` ranks copy at once."""
        return min(own, self.link_bandwidth / self.sharing(n_gpus))

    def host_side(self, profile: HardwareProfile, n_gpus: int) -> HardwareProfile:
        """``profile`` with the host CPU's AdamW rate and DRAM bandwidth one of ``n_gpus``
        lock-step ranks gets (this host's figures, else the GPU profile's, divided by the
        ranks on one host)."""
        ranks = min(max(1, n_gpus), self.gpus_per_host)
        rate = self.host_adam_rate or profile.host_adam_rate
        bandwidth = self.host_memory_bandwidth or profile.host_memory_bandwidth
        return dataclasses.replace(
            profile, host_adam_rate=None if rate is None else rate / ranks,
            host_memory_bandwidth=None if bandwidth is None else bandwidth / ranks)

    def hosts(self, n_gpus: int) -> int:
        """Machines ``n_gpus`` ranks span (each host filled before the next)."""
        return -(-n_gpus // self.gpus_per_host)


_GB = 1e9
_US = 1e-6

#: Interconnects (bus bandwidth per GPU, one ring step's latency).
INTERCONNECTS: dict[str, Interconnect] = {i.name: i for i in (
    Interconnect("pcie3", 10 * _GB, 10 * _US,
                 "PCIe 3.0 x16 through a PCIe switch: 15.75 GB/s nominal, about 10-12 GB/s "
                 "NCCL bus bandwidth in practice (nccl-tests on PCIe V100 hosts)"),
    Interconnect("pcie3-root", 6 * _GB, 15 * _US,
                 "PCIe 3.0 peer traffic routed through the CPU's root complex (no P2P, e.g. "
                 "two K40m behind one bus as in moDNN §V.C); about 6 GB/s"),
    Interconnect("nvlink2", 130 * _GB, 5 * _US,
                 "NVLink 2.0 hybrid cube-mesh of a DGX-1 (V100 SXM2, 6 links x 25 GB/s per "
                 "GPU); about 130 GB/s NCCL all-reduce bus bandwidth on 8 GPUs"),
    Interconnect("nvlink3", 230 * _GB, 5 * _US,
                 "NVLink 3.0 with NVSwitch (DGX A100, 600 GB/s per GPU both ways); about "
                 "230 GB/s NCCL all-reduce bus bandwidth"),
    Interconnect("infiniband-edr", 12 * _GB, 5 * _US,
                 "one 100 Gb/s EDR InfiniBand port per host: 12.5 GB/s nominal"),
    Interconnect("infiniband-edr-x4", 45 * _GB, 5 * _US,
                 "four 100 Gb/s EDR ports per host (DGX-1): 50 GB/s nominal, about 45 usable"),
)}

#: Multi-GPU machines.
HOSTS: dict[str, HostProfile] = {h.name: h for h in (
    HostProfile("k40m-x2", "k40c", 2, 2, 10 * _GB, "pcie3-root", "infiniband-edr",
                "moDNN's machine (§V): two Tesla K40m on one PCIe 3.0 bus; the bus carries "
                "about 10 GB/s each way in all, so two GPUs copying at once get 5 GB/s each "
                "instead of their own 8. CPU: assumed one Haswell Xeon E5 v3, 4 channels "
                "DDR4-2133 = 68.3 GB/s; AdamW rate derived (50% of it over 28 B/parameter)",
                68.3 * _GB, 1.22e9),
    HostProfile("v100-pcie-x8", "v100-pcie", 8, 4, 12 * _GB, "pcie3", "infiniband-edr",
                "8 V100 PCIe in a dual-socket server, one PCIe switch per socket with 4 "
                "GPUs behind its x16 uplink (12 GB/s each way); all-reduce over PCIe; one "
                "EDR port per host. CPUs: assumed 2 x Xeon Gold 6148, 6 channels DDR4-2666 "
                "each = 256 GB/s; AdamW rate derived (50% of it over 28 B/parameter)",
                256 * _GB, 4.57e9),
    HostProfile("dgx1-v100", "v100-pcie", 8, 2, 12 * _GB, "nvlink2", "infiniband-edr-x4",
                "DGX-1 (V100 SXM2): NVLink 2.0 cube-mesh between GPUs; 4 PCIe switches, 2 "
                "GPUs per x16 uplink to the CPUs; 4 EDR ports. Compute priced with the "
                "v100-pcie profile (SXM2's peak is about 12% higher). CPUs: 2 x Xeon "
                "E5-2698 v4 with DDR4-2133 (DGX-1 datasheet), 4 channels each = 136.5 GB/s; "
                "AdamW rate derived (50% of it over 28 B/parameter)",
                136.5 * _GB, 2.44e9),
)}


def get_interconnect(name: str) -> Interconnect:
    """The interconnect called ``name``; ProfileError naming the known ones otherwise."""
    if name not in INTERCONNECTS:
        raise ProfileError(f"unknown interconnect {name!r}; known: {sorted(INTERCONNECTS)}")
    return INTERCONNECTS[name]


def get_host(name: str) -> HostProfile:
    """The host profile called ``name``; ProfileError naming the known ones otherwise."""
    if name not in HOSTS:
        raise ProfileError(f"unknown host profile {name!r}; known: {sorted(HOSTS)}")
    return HOSTS[name]


def default_host(gpu: str | None) -> HostProfile:
    """The host a GPU profile's ranks are assumed to sit in: a host of that GPU if one is
    listed, else an 8-GPU PCIe host of it (4 GPUs per x16 uplink)."""
    name = gpu or "v100-pcie"
    for host in HOSTS.values():
        if host.gpu == name:
            return host
    profile = get_profile(name)
    link = max(profile.h2d_bandwidth, profile.d2h_bandwidth)
    return HostProfile(f"{profile.name}-x8", profile.name, 8, 4, link, "pcie3", "infiniband-edr",
                       f"8 {profile.name} behind PCIe switches, 4 per uplink (assumed)")


def shared_link_profile(profile: HardwareProfile, host: HostProfile,
                        n_gpus: int) -> HardwareProfile:
    """``profile`` with the host-link bandwidth one of ``n_gpus`` lock-step ranks gets."""
    if n_gpus <= 1:
        return profile
    return dataclasses.replace(
        profile, name=f"{profile.name}/{n_gpus}-gpus-on-{host.name}",
        h2d_bandwidth=host.copy_bandwidth(profile.h2d_bandwidth, n_gpus),
        d2h_bandwidth=host.copy_bandwidth(profile.d2h_bandwidth, n_gpus))


def allreduce_time(nbytes: int, n_gpus: int, host: HostProfile) -> float:
    """Seconds of one all-reduce of ``nbytes`` over ``n_gpus`` ranks on ``host``s.

    Inside a host: a ring over the host's interconnect, ``2 (g-1)/g * B / busbw`` plus
    ``2 (g-1)`` latencies. Across ``h`` hosts (hierarchical, as NCCL does): each host's
    network carries ``2 (h-1)/h * B`` more, plus ``2 (h-1)`` latencies.
    """
    if n_gpus <= 1 or nbytes <= 0:
        return 0.0
    g = min(n_gpus, host.gpus_per_host)
    h = host.hosts(n_gpus)
    intra = get_interconnect(host.interconnect)
    seconds = 2 * (g - 1) / g * nbytes / intra.bandwidth + 2 * (g - 1) * intra.latency
    if h > 1:
        net = get_interconnect(host.network)
        seconds += 2 * (h - 1) / h * nbytes / net.bandwidth + 2 * (h - 1) * net.latency
    return seconds
