"""What the optimizer step costs, on the device and on the host (plain Python, no torch).

One function prices it for the planner: ``step_seconds(params_by_placement, profile) ->
(device_s, host_s)``; ``host_steps(graph, schedule, profile)`` lays the same prices out per
parameter for the simulator's host timeline (``outcore.sim.host_steps``). Its rates come
from the hardware profile (``outcore.cost.profiles``):

* on the host, ``profile.host_adam_rate`` parameters per second (torch's CPU AdamW, fused or
  foreach: measured for "this-cpu" by ``outcore.cost.measure_host``; for the catalogue GPUs
  derived from their host's DRAM bandwidth, with the source in ``gpus.json``). A profile
  that gives only ``host_memory_bandwidth`` is priced at ``HOST_EFFICIENCY`` of it over
  ``ADAM_UPDATE_BYTES`` per parameter; one that gives neither is refused (ProfileError
  naming the fields), never priced by a silent constant;
* on the device, ``DEVICE_EFFICIENCY`` of the device's DRAM bandwidth over
  ``ADAM_UPDATE_BYTES``: a fused AdamW kernel is memory-bound (it reads the parameter, its
  gradient and the two moments and writes the parameter and the moments: 7 fp32 streams,
  28 bytes).

Both rates are AdamW's. Another optimizer is priced by the bytes its step moves per
parameter (``update_bytes``: ``outcore.weights.spec.OptimizerSpec.update_bytes``, from
``STATE``), at ``ADAM_UPDATE_BYTES / update_bytes`` times AdamW's rate: SGD without
momentum moves 12 bytes (param and gradient read, param written), so it steps 28/12 as many
parameters per second; AdamW (the default, ``ADAM_UPDATE_BYTES``) is priced as before.

Mixed precision (``outcore.weights.mixed.MasterWeights``: bf16/fp16 weights, fp32 masters
and their state on the host) adds two casts per element on the host, priced at its DRAM
bandwidth (``master_cast_seconds``): the low-precision gradient widened into the master's
``.grad`` (``set_grad``: ``c`` bytes read, 4 written) and the updated master cast into the
parameter (``publish``: 4 read, ``c`` written), ``c = master_cast_bytes`` (the parameter's
element size: 2 for bf16). Every mastered parameter is stepped on the host, where its
master is (``host_steps(masters=)``): one the device keeps is stepped once the pass has
ended and its updated weight copied back h2d. Not modelled: the d2h copy of such a
parameter's gradient (``set_grad`` of a device tensor; ``c`` bytes per element).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from outcore.errors import ProfileError
from outcore.graph.ir import Graph
from outcore.plan.schedule import Schedule
from outcore.plan.weights import gradients, parameters
from outcore.sim.host_steps import HostSteps
from outcore.weights.spec import ADAM_UPDATE_BYTES, update_rate

#: fraction of the device's DRAM bandwidth a fused AdamW kernel reaches (assumption)
DEVICE_EFFICIENCY = 0.8
#: fraction of the host's DRAM bandwidth the CPU step reaches when only that is known
#: (assumption; the catalogue's ``host_adam_mparams`` use the same)
HOST_EFFICIENCY = 0.5
PLACEMENTS = ("device", "host")


def _profile(profile: Any) -> Any:
    """A HardwareProfile, or the ``.profile`` of a cost model that has one."""
    inner = getattr(profile, "profile", None)
    found = inner if inner is not None else profile
    if found is None:
        raise ProfileError("no hardware profile to price the optimizer step: pass a "
                           "HardwareProfile (e.g. get_profile('a100-40gb')) or a cost model "
                           "that carries one")
    return found


def host_adam_rate(profile: Any) -> float:
    """Parameters per second of the optimizer step on ``profile``'s host (module doc)."""
    p = _profile(profile)
    rate = getattr(p, "host_adam_rate", None)
    if rate:
        return float(rate)
    bandwidth = getattr(p, "host_memory_bandwidth", None)
    if bandwidth:
        return HOST_EFFICIENCY * float(bandwidth) / ADAM_UPDATE_BYTES
    raise ProfileError(
        f"hardware profile {getattr(p, 'name', p)!r} gives neither host_adam_mparams nor "
        "host_memory_bandwidth_gbs, so the optimizer step on the host cannot be priced; add "
        "them to the profile (measure this machine with `outcore profile`)")


def device_adam_rate(profile: Any) -> float:
    """Parameters per second of a fused AdamW kernel on ``profile``'s device."""
    p = _profile(profile)
    bandwidth = getattr(p, "memory_bandwidth", None)
    if not bandwidth:
        raise ProfileError(f"hardware profile {getattr(p, 'name', p)!r} has no "
                           "memory_bandwidth to price the optimizer step on the device")
    return DEVICE_EFFICIENCY * float(bandwidth) / ADAM_UPDATE_BYTES


def host_bandwidth(profile: Any, adam_rate: float | None = None) -> float:
    """The host's DRAM bytes/s (``host_adam_rate * ADAM_UPDATE_BYTES / HOST_EFFICIENCY``
    when the profile gives only the rate). ``adam_rate``: the host AdamW rate to derive it
    from instead of the profile's (a chooser's override); ``profile`` may then be None."""
    p = _profile(profile) if profile is not None or adam_rate is None else None
    bandwidth = getattr(p, "host_memory_bandwidth", None)
    if bandwidth:
        return float(bandwidth)
    rate = host_adam_rate(p) if adam_rate is None else adam_rate
    return rate * ADAM_UPDATE_BYTES / HOST_EFFICIENCY


def _count(value: int | Iterable[int]) -> int:
    if isinstance(value, bool):
        raise ProfileError(f"a parameter count must be an integer, got {value!r}")
    total = value if isinstance(value, int) else sum(int(v) for v in value)
    if total < 0:
        raise ProfileError(f"a parameter count must be >= 0, got {total}")
    return total


def master_cast_seconds(numel: int, master_cast_bytes: int, bandwidth: float) -> float:
    """Seconds of the two host casts of a mixed-precision step of ``numel`` elements whose
    low-precision copy has ``master_cast_bytes`` per element (module doc): the gradient
    widened into the master and the master cast into the parameter, ``2 * (4 +
    master_cast_bytes)`` bytes per element at ``bandwidth`` bytes/s; 0 without a cast."""
    if not master_cast_bytes or not numel:
        return 0.0
    return numel * 2 * (4 + master_cast_bytes) / bandwidth


def step_seconds(params_by_placement: Mapping[str, int | Iterable[int]], profile: Any, *,
                 master_cast_bytes: int = 0, update_bytes: int = ADAM_UPDATE_BYTES
                 ) -> tuple[float, float]:
    """(device seconds, host seconds) of one optimizer step.

    ``params_by_placement`` maps "device" and/or "host" to a number of parameters (or an
    iterable of per-tensor element counts) whose step runs there; ``profile`` is a
    ``HardwareProfile`` or a cost model carrying one. ``master_cast_bytes``: the element
    size of the low-precision copy of a host-stepped parameter's fp32 master (2 for bf16
    weights with ``MasterWeights``; 0 when the weight is the master): its two casts are
    added (``master_cast_seconds``). ``update_bytes``: the bytes the
    optimizer's step moves per parameter (default AdamW's; module doc). Raises
    ProfileError for an unknown placement or a profile that cannot price the host
    (``host_adam_rate``).
    """
    unknown = sorted(set(params_by_placement) - set(PLACEMENTS))
    if unknown:
        raise ProfileError(f"unknown optimizer placement {unknown[0]!r}; use {PLACEMENTS}")
    device = _count(params_by_placement.get("device", 0))
    host = _count(params_by_placement.get("host", 0))
    device_s = device / update_rate(device_adam_rate(profile), update_bytes) if device else 0.0
    host_s = 0.0
    if host:
        host_s = host / update_rate(host_adam_rate(profile), update_bytes)
        if master_cast_bytes:
            host_s += master_cast_seconds(host, master_cast_bytes, host_bandwidth(profile))
    if not (math.isfinite(device_s) and math.isfinite(host_s)):
        raise ProfileError("the optimizer step's time is not finite; check the profile's "
                           "bandwidths and host_adam_mparams")
    return device_s, host_s


def host_steps(graph: Graph, schedule: Schedule, profile: Any, *, barrier: bool = False,
               master_cast_bytes: int = 0, update_bytes: int = ADAM_UPDATE_BYTES,
               masters: Collection[str] = ()) -> HostSteps:
    """The optimizer step of ``schedule``'s placement, for ``simulate(..., optimizer=)``.

    A parameter whose gradient the schedule sends to host memory (``host_outputs``) is
    stepped on the host, as soon as that gradient lands; if the parameter is held in host
    memory (``host_static``) its step also waits for its last prefetch of the step (it
    updates the copy that prefetch reads), else the device keeps the weight and the updated
    weight is copied back h2d (ZeRO-Offload). Every other parameter is stepped on the
    device after the pass. ``barrier``: clipping or a GradScaler, which need every gradient
    before any step (plus the global norm over the host gradients at host DRAM bandwidth).
    ``update_bytes``: the bytes the optimizer's step moves per parameter (``step_seconds``).
    ``master_cast_bytes``: the casts of every host-stepped parameter (``step_seconds``).
    ``masters``: names of the parameters with an fp32 master on the host
    (``MasterWeights``): each is stepped on the host with its two casts at its own element
    size; one whose gradient is not sent is stepped once the pass has ended and its updated
    weight copied back h2d (module doc).
    """
    sent = set(schedule.host_outputs)
    held = set(schedule.host_static)
    mastered = set(masters)
    params = parameters(graph)
    host: dict[int, float] = {}
    wait_for: dict[int, int] = {}
    h2d: dict[int, int] = {}
    device = 0
    norm_bytes = 0
    for name, g in gradients(graph).items():
        p = params.get(name)
        if p is None:
            continue
        numel = math.prod(graph.tensors[p].shape)
        if g in sent or p in held or name in mastered:
            cast = graph.tensors[p].nbytes // max(numel, 1) if name in mastered \
                else master_cast_bytes
            host[g] = step_seconds({"host": numel}, profile, master_cast_bytes=cast,
                                   update_bytes=update_bytes)[1]
            norm_bytes += graph.tensors[graph.tensors[g].storage].nbytes
            if p in held:
                wait_for[g] = p
            else:
                h2d[g] = graph.tensors[p].nbytes
        else:
            device += numel
    barrier_s = norm_bytes / host_bandwidth(profile) if barrier and norm_bytes else 0.0
    return HostSteps(host=host, wait_for=wait_for, h2d=h2d,
                     device_seconds=step_seconds({"device": device}, profile,
                                                 update_bytes=update_bytes)[0],
                     barrier=barrier, barrier_seconds=barrier_s)
