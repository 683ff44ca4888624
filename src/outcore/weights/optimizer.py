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

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from outcore.errors import OutcoreError
from outcore.weights.mixed import MasterWeights
from outcore.weights.step_cost import step_seconds

__all__ = ["measure_host_adam", "state_bytes", "step_seconds"]


def _on(group: Mapping[str, Any], key: str) -> int:
    return 1 if group.get(key) else 0


#: Per torch optimizer (its class name): the state ``step()`` keeps per parameter, read off
#: torch 2.13's ``_init_group``: (how many tensors of the parameter's shape and dtype, from
#: the group's options; how many 0-dim tensors of torch's scalar dtype). Checked against
#: the real state after one step for every entry (tests/weights/test_optimizer_state.py).
_STATE: dict[str, tuple[Callable[[Mapping[str, Any]], int], int]] = {
    # exp_avg, exp_avg_sq (+ max_exp_avg_sq with amsgrad); step
    "Adam": (lambda g: 2 + _on(g, "amsgrad"), 1),
    "AdamW": (lambda g: 2 + _on(g, "amsgrad"), 1),
    "NAdam": (lambda g: 2, 2),  # exp_avg, exp_avg_sq; step, mu_product
    "RAdam": (lambda g: 2, 1),  # exp_avg, exp_avg_sq; step
    "Adamax": (lambda g: 2, 1),  # exp_avg, exp_inf; step
    "Adadelta": (lambda g: 2, 1),  # square_avg, acc_delta; step
    "Adagrad": (lambda g: 1, 1),  # sum (made when the optimizer is built); step
    # square_avg (+ momentum_buffer with momentum > 0, + grad_avg when centered); step
    "RMSprop": (lambda g: 1 + (1 if g.get("momentum", 0) > 0 else 0) + _on(g, "centered"), 1),
    "SGD": (lambda g: _on(g, "momentum"), 0),  # momentum_buffer when momentum != 0
    "ASGD": (lambda g: 1, 3),  # ax (the average); step, eta, mu
    "Rprop": (lambda g: 2, 1),  # prev (the last gradient), step_size; step
    # step; and row_var and col_var (the variance factored over the last two dimensions)
    # of a parameter of 2 or more dimensions, else variance (full size): ``_factored``
    "Adafactor": (lambda g: 0, 1),
}

#: Why an optimizer cannot be planned per parameter, and what to use instead.
_REFUSED = {
    "LBFGS": "LBFGS keeps one state for all the parameters together (its curvature history: "
             "history_size pairs of vectors as long as every parameter flattened into one, "
             "and the last direction and gradient) and its step(closure) runs forward and "
             "backward again, several times per step; outcore holds a parameter's state "
             "where the parameter lives and steps each host-held parameter on its own, so it "
             "cannot split LBFGS. Use a per-parameter optimizer (AdamW, Adam, SGD, "
             "Adafactor, ...) with the weights planned, or plan only the activations: "
             "outcore.compile(model, loss_fn, batch, budget=...) without optimizer=, and a "
             "closure that calls trainer.step(x, y)",
}


def state_bytes(optimizer: torch.optim.Optimizer, model: nn.Module,
                master: MasterWeights | None = None) -> dict[str, int]:
    """Parameter name (as ``named_parameters`` spells it) -> bytes of its optimizer state
    once the optimizer has stepped: the sum of ``nbytes`` of the tensors torch keeps in
    ``optimizer.state[p]``. The optimizers of ``_STATE`` (torch's Adam, AdamW, NAdam,
    RAdam, Adamax, Adadelta, Adagrad, RMSprop, SGD, ASGD, Rprop, Adafactor) are sized from
    their options before any step; any other is sized from its current state, which must
    then exist (take one step first). LBFGS is refused (``_REFUSED`` says why). With
    ``master`` (mixed precision: the optimizer is built on the fp32 masters) a parameter's
    state is its master's plus the master itself. Raises OutcoreError naming what to do
    otherwise."""
    kind = type(optimizer).__name__
    if kind in _REFUSED:
        raise OutcoreError(f"outcore cannot plan the weights with {kind}: {_REFUSED[kind]}.")
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


def _one(optimizer: torch.optim.Optimizer, kind: str, group: dict, p: torch.Tensor) -> int:
    """Bytes of ``p``'s state under ``optimizer`` (``state_bytes``)."""
    if kind in _STATE:
        full, scalars = _STATE[kind]
        if kind == "Adafactor":
            return _factored(p) + scalars * _scalar_bytes(group)
        return full(group) * p.numel() * p.element_size() + scalars * _scalar_bytes(group)
    state = optimizer.state.get(p)
    if not state:
        raise OutcoreError(f"outcore cannot size the state of {kind} before it has stepped; "
                           "take one optimizer step first, or use one of "
                           f"{', '.join(sorted(_STATE))}")
    return sum(v.numel() * v.element_size() for v in state.values()
               if isinstance(v, torch.Tensor))


def _scalar_bytes(group: Mapping[str, Any]) -> int:
    """Bytes of one 0-dim state tensor (a step count): torch's scalar dtype, float32 for a
    fused optimizer, else float64 when that is the default dtype, else float32."""
    if not group.get("fused") and torch.get_default_dtype() == torch.float64:
        return 8
    return 4


def _factored(p: torch.Tensor) -> int:
    """Bytes of Adafactor's variance of ``p``: for 2 or more dimensions a row factor (the
    shape with the last dimension 1) and a column factor (the next-to-last dimension 1),
    else one tensor of ``p``'s shape; all of ``p``'s dtype."""
    shape = list(p.shape)
    if len(shape) < 2:
        return p.numel() * p.element_size()
    rows = math.prod(shape[:-1])
    cols = math.prod(shape[:-2]) * shape[-1]
    return (rows + cols) * p.element_size()


def measure_host_adam(numel: int = 1 << 22, repeats: int = 3) -> float:
    """Parameters per second of torch's CPU AdamW on this machine: the faster of
    ``fused=True`` and ``foreach=True`` (``outcore.cost.measure_host.measure_adam_rate``,
    what the "this-cpu" profile's ``host_adam_rate`` holds)."""
    from outcore.cost.measure_host import measure_adam_rate

    return measure_adam_rate(numel, repeats)[0]
