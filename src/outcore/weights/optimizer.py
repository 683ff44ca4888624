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

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from outcore.errors import InvalidArgumentError, OutcoreError
from outcore.weights.mixed import MasterWeights
from outcore.weights.spec import (
    ADAM_UPDATE_BYTES,
    REFUSED,
    STATE,
    OptimizerSpec,
    torch_spec,
)
from outcore.weights.step_cost import step_seconds

__all__ = ["measure_host_adam", "state_bytes", "step_seconds"]


def state_bytes(optimizer: torch.optim.Optimizer, model: nn.Module,
                master: MasterWeights | None = None) -> dict[str, int]:
    """Parameter name (as ``named_parameters`` spells it) -> bytes of its optimizer state
    once the optimizer has stepped: the sum of ``nbytes`` of the tensors torch keeps in
    ``optimizer.state[p]``. The optimizers of ``outcore.weights.spec.STATE`` (torch's Adam,
    AdamW, NAdam, RAdam, Adamax, Adadelta, Adagrad, RMSprop, SGD, ASGD, Rprop, Adafactor)
    are sized from their options before any step, by the same account ``outcore.plan``
    uses; any other is sized from its current state, which must
    then exist (take one step first). LBFGS is refused (``REFUSED`` says why). With
    ``master`` (mixed precision: the optimizer is built on the fp32 masters) a parameter's
    state is its master's plus the master itself. Raises OutcoreError naming what to do
    otherwise."""
    kind = type(optimizer).__name__
    if kind in REFUSED:
        raise OutcoreError(f"outcore cannot plan the weights with {kind}: {REFUSED[kind]}.")
    names = {id(p): n for n, p in model.named_parameters()}
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


def _one(optimizer: torch.optim.Optimizer, kind: str, group: Mapping[str, Any],
         p: torch.Tensor) -> int:
    """Bytes of ``p``'s state under ``optimizer`` (``state_bytes``)."""
    if kind in STATE:
        spec = _group_spec(kind, group)
        return spec.state_bytes(p.numel(), p.element_size(), tuple(p.shape))
    state = optimizer.state.get(p)
    if not state:
        raise OutcoreError(f"outcore cannot size the state of {kind} before it has stepped; "
                           "take one optimizer step first, or use one of "
                           f"{', '.join(sorted(STATE))}")
    return sum(v.numel() * v.element_size() for v in state.values()
               if isinstance(v, torch.Tensor))


def _group_spec(kind: str, group: Mapping[str, Any]) -> OptimizerSpec:
    """``STATE``'s spec of one param group: the state in the parameter's own dtype."""
    return torch_spec(kind, group, master=False, own_dtype=True,
                      scalar_bytes=_scalar_bytes(group))


def built_spec(optimizer: torch.optim.Optimizer) -> OptimizerSpec:
    """The spec of a built optimizer (``outcore.weights.spec.spec_of``): ``STATE``'s, the
    state in each parameter's own dtype. Raises InvalidArgumentError for LBFGS, an
    optimizer ``STATE`` does not know, or param groups that keep different state (then
    build it on ``model.named_parameters()``: ``graph_state_bytes`` sizes it by name)."""
    kind = type(optimizer).__name__
    specs = {_group_spec(kind, group) for group in optimizer.param_groups}
    if len(specs) > 1:
        raise InvalidArgumentError(kind, "param groups that keep the same state per "
                                   "parameter, when the optimizer does not name its "
                                   "parameters", "Build it on model.named_parameters() (torch "
                                   "then names each group's parameters and outcore sizes "
                                   "each by its group), or compile with outcore.compile(model, "
                                   "..., optimizer=), which sees the model.")
    return specs.pop()


def built_update_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes a step of ``optimizer`` moves per parameter (``OptimizerSpec.update_bytes``):
    the most of any param group, as ``STATE`` sizes each; an optimizer ``STATE`` does not
    know (or LBFGS, refused where its state is sized) is priced as AdamW."""
    kind = type(optimizer).__name__
    if kind not in STATE:
        return ADAM_UPDATE_BYTES
    return max(_group_spec(kind, group).update_bytes() for group in optimizer.param_groups)


def named_state_bytes(optimizer: torch.optim.Optimizer, names: set[str]
                      ) -> dict[str, int] | None:
    """Parameter name -> bytes of its state (``state_bytes``), when every param group
    names its parameters (``param_names``: built on ``named_parameters()``), else None.
    ``names``: the graph's parameter names (without ``model.``); a parameter the optimizer
    names but the graph lacks raises InvalidArgumentError."""
    groups = optimizer.param_groups
    if not all(group.get("param_names") for group in groups):
        return None
    kind = type(optimizer).__name__
    if kind in REFUSED:
        raise InvalidArgumentError(kind, "a per-parameter optimizer", REFUSED[kind] + ".")
    sizes: dict[str, int] = {}
    for group in groups:
        for name, p in zip(group["param_names"], group["params"], strict=True):
            key = name.removeprefix("model.")
            if key not in names:
                raise InvalidArgumentError(name, "the name of one of the graph's parameters "
                                           f"(such as {sorted(names)[:3]})", "Build the "
                                           "optimizer on the captured model's "
                                           "named_parameters().")
            sizes[key] = _one(optimizer, kind, group, p)
    return sizes


def _scalar_bytes(group: Mapping[str, Any]) -> int:
    """Bytes of one 0-dim state tensor (a step count): torch's scalar dtype, float32 for a
    fused optimizer, else float64 when that is the default dtype, else float32."""
    if not group.get("fused") and torch.get_default_dtype() == torch.float64:
        return 8
    return 4


def measure_host_adam(numel: int = 1 << 22, repeats: int = 3) -> float:
    """Parameters per second of torch's CPU AdamW on this machine: the faster of
    ``fused=True`` and ``foreach=True`` (``outcore.cost.measure_host.measure_adam_rate``,
    what the "this-cpu" profile's ``host_adam_rate`` holds)."""
    from outcore.cost.measure_host import measure_adam_rate

    return measure_adam_rate(numel, repeats)[0]
