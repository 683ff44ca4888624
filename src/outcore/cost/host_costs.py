"""Host time of the instructions that are not kernels, on a device the host drives in step.

On a GPU the host enqueues kernels, copies and event waits asynchronously and runs ahead
of the device, so the host's cost of a Free, of issuing a copy or of a Wait is hidden and
the simulator charges nothing for it (``HostCosts()``, all zero). On a device the host
drives synchronously, such as the CPU-emulated one, every instruction runs on the compute
thread and its host time adds to the step: freeing a tensor, issuing a copy (a prefetch
also allocates, and on the emulated device fills the new buffer with poison), checking an
already finished copy, and waking up after a Wait that blocked.

``HostCosts`` holds those seconds; ``outcore.cost.measure_step`` measures them inside real
steps. Invariant: every field is a finite number >= 0.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from outcore.errors import ProfileError


@dataclass(frozen=True)
class HostCosts:
    """Seconds the compute thread spends per non-kernel instruction.

    Attributes:
        free: per Free.
        offload: issuing one Offload (the copy enters its engine after this).
        prefetch: issuing one Prefetch, fixed part (allocation, queueing).
        prefetch_per_byte: issuing one Prefetch, per byte of the tensor (e.g. the
            emulated device's poison fill of the fresh buffer).
        wait: a Wait whose copy had already ended.
        wake: added after a Wait that blocked: the copy's end wakes the host thread, which
            resumes this much later.
    """

    free: float = 0.0
    offload: float = 0.0
    prefetch: float = 0.0
    prefetch_per_byte: float = 0.0
    wait: float = 0.0
    wake: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value < 0:
                raise ProfileError(f"host costs: field {f.name!r} must be a finite number "
                                   f">= 0 seconds, got {value!r}")

    def issue(self, direction: str, nbytes: int) -> float:
        """Host seconds to issue a copy of ``nbytes`` in ``direction`` ("d2h" or "h2d")."""
        if direction == "d2h":
            return self.offload
        return self.prefetch + self.prefetch_per_byte * nbytes

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: Any, where: str = "host_costs") -> HostCosts:
        """Inverse of ``to_dict``; ProfileError names a field that is unknown or bad."""
        if not isinstance(doc, dict):
            raise ProfileError(f"{where} must be an object of seconds, got {doc!r}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(doc) - known)
        if unknown:
            raise ProfileError(f"{where}: field {unknown[0]!r} is unknown; known fields: "
                               f"{sorted(known)}")
        return cls(**doc)


#: What a device that runs ahead of its host (a GPU) pays: nothing on the compute stream.
NO_HOST_COSTS = HostCosts()


def host_costs_of(model: object) -> HostCosts:
    """The ``host_costs`` a cost model carries, or ``NO_HOST_COSTS``."""
    costs = getattr(model, "host_costs", None)
    if costs is None:
        return NO_HOST_COSTS
    if not isinstance(costs, HostCosts):
        raise ProfileError(f"cost model's host_costs must be a HostCosts, got {costs!r}")
    return costs
