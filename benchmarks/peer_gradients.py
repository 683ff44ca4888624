"""Does a peer compute the user's step? Gradients of one seeded step against a reference.

PyTorch's memory-budget partitioner (``activation_memory_budget`` < 1) can recompute a
dropout in the backward with fresh draws, so the backward differentiates another mask than
the forward used: the loss is right, the gradients are not (pytorch/pytorch#190758; on the
GPT of ``vs_workloads``, relative error 0.74-0.84 at 0.5 and 0.2). A benchmark that times such
a peer times a different computation, so ``vs_pytorch.py`` and ``cuda_inductor_check.py``
check every compiled peer here and say so beside its row.

The reference: eager PyTorch when the peer draws with eager's generator (Inductor's
``fallback_random``); otherwise Inductor's own generator draws other masks than eager, and
the reference is the same model compiled at ``activation_memory_budget`` 1.0 (saves every
mask it needs) on that generator, at the same seed (``budget_compile``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

#: a relative gradient error above this is not rounding (Inductor's is ~1e-6 in float32)
WRONG = 1e-3


def zero_grad(model: nn.Module) -> None:
    for p in model.parameters():
        p.grad = None


def seeded_run(step: Callable[[], Any], model: nn.Module,
               seed: int = 0) -> tuple[float, list[torch.Tensor | None]]:
    """The loss and gradients of one step at ``seed`` (the gradients reset before)."""
    zero_grad(model)
    torch.manual_seed(seed)
    loss = float(step())
    grads = [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]
    zero_grad(model)
    return loss, grads


def relative_error(got: list[torch.Tensor | None], ref: list[torch.Tensor | None]) -> float:
    """The largest per-parameter ``||got - ref|| / ||ref||`` (inf when a gradient is missing)."""
    worst = 0.0
    for g, r in zip(got, ref, strict=True):
        if r is None and g is None:
            continue
        if r is None or g is None:
            return float("inf")
        worst = max(worst, float((g.double() - r.double()).norm()
                                 / r.double().norm().clamp_min(1e-30)))
    return worst


def budget_compile(model: nn.Module, budget: float, fallback_random: bool) -> nn.Module:
    """A fresh copy of ``model`` under Inductor at ``activation_memory_budget`` = ``budget``,
    with a backend of its own: ``torch.compile``'s ``backend="inductor"`` would let dynamo
    hand a second copy the first one's compiled code (same code object, an equal backend),
    whatever the budget. AOTAutograd's cache is off around the compile."""
    import torch._functorch.config as fconfig
    from torch._inductor.compile_fx import compile_fx

    def backend(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> Any:
        with fconfig.patch(activation_memory_budget=budget, enable_autograd_cache=False):
            return compile_fx(gm, inputs, config_patches={"fallback_random": fallback_random})

    return torch.compile(copy.deepcopy(model), backend=backend, dynamic=False)


def verdict(error: float, reference: str) -> str:
    """A note for a row: its gradient error and, above ``WRONG``, that it is wrong."""
    words = f"gradient error {error:.1e} vs {reference}"
    return words + (": WRONG GRADIENTS" if error > WRONG else "")


def peer_note(step: Callable[[], Any], model: nn.Module, eager_model: nn.Module,
              make_step: Callable[[nn.Module], Callable[[], Any]],
              fallback_random: bool) -> str:
    """``verdict`` for a compiled peer (``step`` over ``model``) against its reference (module
    docstring): eager ``eager_model`` when the peer draws on eager's generator
    (``fallback_random``), else a budget-1.0 compile of it on Inductor's; ``make_step`` turns
    a model into its training step."""
    _, grads = seeded_run(step, model)
    if fallback_random:
        ref, name = seeded_run(make_step(eager_model), eager_model), "eager"
    else:
        rm = budget_compile(eager_model, 1.0, fallback_random=False)
        ref, name = seeded_run(make_step(rm), rm), "budget 1.0, Inductor's generator"
    return verdict(relative_error(grads, ref[1]), name)
