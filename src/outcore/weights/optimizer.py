"""What an optimizer keeps per parameter, and how fast this CPU steps AdamW.

outcore does not wrap the user's optimizer: ``torch.optim`` semantics (``step``,
``zero_grad``, ``state_dict``/``load_state_dict``, LR schedulers, gradient clipping,
``GradScaler``) stay the user's. A parameter held in host memory is a CPU tensor with its
gradient and optimizer state on the host, so the user's optimizer steps it on the host
with torch's CPU kernels (foreach/fused where torch picks them); the planner only needs the
bytes the state occupies (``state_bytes``) to count the device-held part against the budget.
What a step costs where it runs is ``step_seconds`` (``outcore.weights.step_cost``, re-exported
here; plain Python, so the planner can price it without torch).
"""

from __future__ import annotations

import torch
from torch import nn

from outcore.errors import OutcoreError
from outcore.weights.mixed import MasterWeights
from outcore.weights.step_cost import step_seconds

__all__ = ["measure_host_adam", "state_bytes", "step_seconds"]

#: state tensors per parameter, each the parameter's size and dtype, besides a scalar step
_MOMENTS = {"Adam": 2, "AdamW": 2, "NAdam": 2, "RAdam": 2, "Adamax": 2, "Adagrad": 1,
            "RMSprop": 1}


def state_bytes(optimizer: torch.optim.Optimizer, model: nn.Module,
                master: MasterWeights | None = None) -> dict[str, int]:
    """Parameter name (as ``named_parameters`` spells it) -> bytes of its optimizer state
    once the optimizer has stepped. Known optimizers are sized from their options; any
    other is sized from its current state, which must then exist (take one step first).
    With ``master`` (mixed precision: the optimizer is built on the fp32 masters) a
    parameter's state is its master's plus the master itself. Raises OutcoreError naming
    what to do otherwise."""
    names = {id(p): n for n, p in model.named_parameters()}
    kind = type(optimizer).__name__
    sizes: dict[str, int] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            if master is not None:
                name = master.name_of(p)
                sizes[name] = _one(optimizer, kind, group, p) + p.numel() * p.element_size()
                continue
            known = names.get(id(p))
            if known is None:
                raise OutcoreError("the optimizer holds a parameter that is not the model's; "
                                   "give outcore the optimizer built on model.parameters() "
                                   "(or on MasterWeights(model).parameters() with master=)")
            sizes[known] = _one(optimizer, kind, group, p)
    return sizes


def _one(optimizer: torch.optim.Optimizer, kind: str, group: dict, p: torch.Tensor) -> int:
    nbytes = p.numel() * p.element_size()
    if kind in _MOMENTS:
        moments = _MOMENTS[kind] + (1 if group.get("amsgrad") else 0)
        step = 4 if kind in ("Adam", "AdamW", "NAdam", "RAdam", "Adamax") else 0
        return moments * nbytes + step
    if kind == "SGD":
        return nbytes if group.get("momentum", 0) else 0
    state = optimizer.state.get(p)
    if not state:
        raise OutcoreError(f"outcore cannot size the state of {kind} before it has stepped; "
                           "take one optimizer step first, or use Adam, AdamW or SGD")
    return sum(v.numel() * v.element_size() for v in state.values()
               if isinstance(v, torch.Tensor))


def measure_host_adam(numel: int = 1 << 22, repeats: int = 3) -> float:
    """Parameters per second of torch's CPU AdamW on this machine: the faster of
    ``fused=True`` and ``foreach=True`` (``outcore.cost.measure_host.measure_adam_rate``,
    what the "this-cpu" profile's ``host_adam_rate`` holds)."""
    from outcore.cost.measure_host import measure_adam_rate

    return measure_adam_rate(numel, repeats)[0]
