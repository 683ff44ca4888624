"""What an optimizer keeps per parameter and what its step costs, without building it.

Plain Python (no torch). ``outcore.plan(graph, budget, optimizer="adamw")`` plans a graph
captured with fake tensors, where no optimizer exists: an ``OptimizerSpec`` sizes the
optimizer's state from the parameters' element counts and dtypes.

The named specs follow the mixed-precision recipe fine-tuning runs (and ZeRO-Offload
keeps on the host): fp32 moments, and an fp32 master copy of every parameter whose dtype is
narrower than fp32 (bf16/fp16 weights on the device). So AdamW holds 8 bytes per element of
an fp32 parameter and 12 of a bf16 one, plus a 4-byte step count; SGD with momentum 4 (8
with a master). ``OptimizerSpec(name, bytes_per_element=...)`` states any other size.

``optimizer_seconds`` is the one place the optimizer step's time enters the plan: the
chooser adds it to the simulated step (``outcore.weights.choose``) and the lower bound
takes it at the fewest host-held elements any fitting placement has
(``outcore.weights.bound``). Its contract: non-decreasing in ``host_numel`` for a fixed
total (moving a parameter's step to the host never makes the step faster), which is what
makes the bound's use of it sound.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from outcore.errors import InvalidArgumentError

#: Parameters per second of AdamW, when not measured: a GPU and one CPU socket (fused
#: kernels, fp32). ``outcore.weights.optimizer.measure_host_adam`` measures this CPU.
DEVICE_ADAM_RATE = 2.0e10
HOST_ADAM_RATE = 5.0e8


@dataclass(frozen=True)
class OptimizerSpec:
    """An optimizer's state per parameter: ``moments`` fp32 tensors of the parameter's
    shape, an fp32 master copy of narrower parameters when ``master``, a ``step_bytes``
    scalar; or exactly ``bytes_per_element`` per element when given (then ``moments`` and
    ``master`` are ignored)."""

    name: str
    moments: int = 2
    master: bool = True
    step_bytes: int = 4
    bytes_per_element: float | None = None

    def state_bytes(self, numel: int, itemsize: int) -> int:
        """Bytes of one parameter's state (``numel`` elements of ``itemsize`` bytes)."""
        if self.bytes_per_element is not None:
            return round(self.bytes_per_element * numel) + self.step_bytes
        master = 4 * numel if self.master and itemsize < 4 else 0
        return 4 * self.moments * numel + master + self.step_bytes


SPECS: dict[str, OptimizerSpec] = {
    "adamw": OptimizerSpec("adamw"),
    "adam": OptimizerSpec("adam"),
    "sgd": OptimizerSpec("sgd", moments=1, step_bytes=0),
}


def spec_of(optimizer: Any) -> OptimizerSpec:
    """An ``OptimizerSpec`` from a name ("adamw", "adam", "sgd"), a spec, or a built
    ``torch.optim`` optimizer (sized as ``outcore.weights.optimizer.state_bytes`` sizes it:
    its state in the parameters' own dtype, no master copy). Raises InvalidArgumentError
    for anything else."""
    if isinstance(optimizer, OptimizerSpec):
        return optimizer
    if isinstance(optimizer, str):
        spec = SPECS.get(optimizer.lower())
        if spec is None:
            raise InvalidArgumentError(optimizer, f"an optimizer name among {sorted(SPECS)}",
                                       "Or pass OptimizerSpec(name, bytes_per_element=...) "
                                       "or the torch optimizer itself.")
        return spec
    groups = getattr(optimizer, "param_groups", None)
    if not groups:
        raise InvalidArgumentError(optimizer, "an optimizer name, an OptimizerSpec or a "
                                   "torch.optim optimizer")
    kind = type(optimizer).__name__
    group = groups[0]
    if kind in ("Adam", "AdamW", "NAdam", "RAdam", "Adamax"):
        moments, step = 2 + (1 if group.get("amsgrad") else 0), 4
    elif kind == "SGD":
        moments, step = (1 if group.get("momentum", 0) else 0), 0
    else:
        raise InvalidArgumentError(kind, "Adam, AdamW, NAdam, RAdam, Adamax or SGD to plan "
                                   "with", "For another optimizer pass OptimizerSpec(name, "
                                   "bytes_per_element=...).")
    params = group.get("params") or []
    itemsize = params[0].element_size() if params else 4
    return OptimizerSpec(kind.lower(), step_bytes=step, bytes_per_element=moments * itemsize)


def graph_state_bytes(graph: Any, optimizer: Any) -> dict[str, int]:
    """Parameter name -> bytes of its optimizer state, for every parameter of ``graph``."""
    import math

    from outcore.plan.weights import parameters

    spec = spec_of(optimizer)
    out = {}
    for name, tid in parameters(graph).items():
        t = graph.tensors[tid]
        numel = math.prod(t.shape)
        out[name] = spec.state_bytes(numel, t.nbytes // numel if numel else 4)
    return out


def optimizer_seconds(host_numel: int, device_numel: int, *,
                      host_rate: float = HOST_ADAM_RATE,
                      device_rate: float = DEVICE_ADAM_RATE) -> float:
    """Seconds of the optimizer step with ``host_numel`` elements stepped on the host and
    ``device_numel`` on the device, one after the other (not overlapped with backward).
    Non-decreasing in ``host_numel`` at a fixed total while ``host_rate <= device_rate``
    (module doc)."""
    return host_numel / host_rate + device_numel / device_rate

