"""The optimizer step beside a simulated schedule: a CPU timeline after the gradients' copies.

A ``HostSteps`` says what the optimizer does once backward has made the gradients (built
for a placement by ``outcore.weights.step_cost.host_steps``; the simulator only times it):

* ``host``: gradient tensor id -> seconds of its parameter's step on the CPU. That step
  starts when the gradient's storage has landed in host memory (the end of its d2h copy)
  and, for a parameter held in host memory (``wait_for``: gradient -> parameter id), not
  before its last h2d copy of the step has landed (the step updates the host copy in
  place, which that copy reads). The CPU is one resource: host steps run one after
  another, in the order their gradients land;
* ``barrier``: gradient clipping or a GradScaler needs every gradient first (the global
  norm, the inf check): then no host step starts before the compute stream has ended
  and every host gradient has landed, plus ``barrier_seconds`` (the norm on the host);
* ``h2d``: gradient id -> bytes copied host-to-device after its host step: the updated
  weight of a parameter the device keeps (ZeRO-Offload: master and state on the host).
  These copies queue on the h2d engine after the pass's own copies;
* ``device_seconds``: the step of the device-held parameters, on the compute stream after
  the pass's last instruction.

``timeline`` returns when the step ends:
``max(end of the pass, end of the device step, end of the last host step, end of the last
updated-weight h2d)``. A gradient the schedule does not send to host (no d2h copy) but
listed in ``host`` is taken as landed when the compute stream ends.

Not modelled: the CPU step competing with the copy engines for host DRAM bandwidth.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from outcore.errors import ProfileError


@dataclass(frozen=True)
class HostSteps:
    """The optimizer's work after backward (module doc). Seconds and bytes are >= 0."""

    host: Mapping[int, float] = field(default_factory=dict)
    wait_for: Mapping[int, int] = field(default_factory=dict)
    h2d: Mapping[int, int] = field(default_factory=dict)
    device_seconds: float = 0.0
    barrier: bool = False
    barrier_seconds: float = 0.0

    def __post_init__(self) -> None:
        values = [*self.host.values(), self.device_seconds, self.barrier_seconds]
        if any(not (math.isfinite(v) and v >= 0) for v in values):
            raise ProfileError("optimizer step times must be finite numbers >= 0 seconds")
        if any(b < 0 for b in self.h2d.values()):
            raise ProfileError("updated-weight copies must be >= 0 bytes")


@dataclass(frozen=True)
class StepTimeline:
    """When the optimizer's work ran: ``end`` is the step's end (module doc)."""

    end: float
    host_busy: float
    host_end: float
    device_end: float
    h2d_end: float
    h2d_bytes: int
    #: gradient id -> (start, end) of its host step
    steps: Mapping[int, tuple[float, float]] = field(default_factory=dict)


def timeline(work: HostSteps, *, compute_end: float, pass_end: float,
             landed: Mapping[int, float], prefetched: Mapping[int, float],
             h2d_free: float, h2d_time: Callable[[int], float]) -> StepTimeline:
    """Time ``work`` after a pass whose compute stream ended at ``compute_end`` and whose
    copies all ended by ``pass_end``. ``landed``: gradient id -> end of its d2h copy;
    ``prefetched``: tensor id -> end of its last h2d copy; ``h2d_free``: when the h2d
    engine is free; ``h2d_time(nbytes)``: seconds of one h2d copy."""
    floor = 0.0
    if work.barrier:
        last = max((landed.get(g, compute_end) for g in work.host), default=compute_end)
        floor = max(compute_end, last) + work.barrier_seconds

    def ready(g: int) -> float:
        own = landed.get(g, compute_end)
        param = work.wait_for.get(g)
        if param is not None:
            own = max(own, prefetched.get(param, 0.0))
        return max(own, floor)

    cpu = 0.0
    busy = 0.0
    steps: dict[int, tuple[float, float]] = {}
    for g in sorted(work.host, key=lambda g: (ready(g), g)):
        start = max(ready(g), cpu)
        cpu = start + work.host[g]
        busy += work.host[g]
        steps[g] = (start, cpu)
    engine = h2d_free
    moved = 0
    for g in sorted(work.h2d, key=lambda g: (steps.get(g, (0.0, compute_end))[1], g)):
        nbytes = work.h2d[g]
        begin = max(engine, steps.get(g, (0.0, compute_end))[1])
        seconds = float(h2d_time(nbytes))
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ProfileError(f"cost model gave transfer time {seconds!r} for {nbytes} bytes")
        engine = begin + seconds
        moved += nbytes
    device_end = compute_end + work.device_seconds
    h2d_end = engine if work.h2d else 0.0
    end = max(pass_end, device_end, cpu, h2d_end)
    return StepTimeline(end, busy, cpu, device_end, h2d_end, moved, steps)
