"""User hooks that a planned step would skip, refused before anything runs.

The executor runs the captured ATen graph without autograd, so nothing autograd would call
runs by itself. The hooks on a leaf's gradient, a tensor hook on a parameter or a batch
tensor (``p.register_hook``) and a post-accumulate-grad hook
(``p.register_post_accumulate_grad_hook``), are called by the step's commit as autograd
calls them (``outcore.runtime.leaf_hooks``), where the trainer commits the gradients in
one place: ``outcore.compile``'s Trainer and the ``PlannedTrainer``. A trainer that hands
gradients elsewhere as they are made (data parallel's reducer, the weights trainer's
optimizer steps) refuses them (``check_hooks(..., leaf_hooks=<why>)``). A module backward
hook (``register_full_backward_hook``, ``register_full_backward_pre_hook``) or a global one
reads gradients at a module's boundary, which a planned step does not keep: always
refused. Forward hooks and forward pre-hooks are traced into the graph like the forward
itself, so the ones in place when a step is captured are the ones it computes with:
``forward_hooks`` fingerprints them for the Trainer's signature (a hook registered or
removed after a step was captured is captured again; ``PlannedTrainer`` refuses the step).
``check_hooks`` raises ``UnsupportedModelError`` naming each hook refused and what to do,
so that a step never silently computes gradients other than eager's.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from torch import nn
from torch.nn.modules import module as module_mod

from outcore.capture.batching import split_batch_leaves
from outcore.errors import UnsupportedModelError
from outcore.runtime.leaf_hooks import has_leaf_hooks


def module_grad_hooks(model: nn.Module) -> list[str]:
    """A line per module backward hook (the module's own or a global one): no planned
    step calls them."""
    found: list[str] = []
    for name, mod in model.named_modules():
        if mod._backward_hooks or mod._backward_pre_hooks:
            found.append(f"module {name or type(model).__name__!r}: a backward hook "
                         "(register_full_backward_hook / register_full_backward_pre_hook)")
    if module_mod._global_backward_hooks or module_mod._global_backward_pre_hooks:
        found.append("a global module backward hook "
                     "(torch.nn.modules.module.register_module_full_backward_hook)")
    return found


def leaf_grad_hooks(model: nn.Module, batch: Any = None) -> list[str]:
    """A line per parameter, and per tensor of ``batch``, carrying a hook on its gradient
    (a tensor hook or a post-accumulate-grad hook)."""
    found = [f"parameter {name!r}" for name, p in model.named_parameters()
             if has_leaf_hooks(p)]
    if batch is not None:
        found += [f"batch tensor {i}" for i, t in enumerate(split_batch_leaves(batch)[0])
                  if has_leaf_hooks(t)]
    return found


def check_hooks(model: nn.Module, batch: Any = None, *, leaf_hooks: str | None = None
                ) -> None:
    """Raise UnsupportedModelError when ``model`` carries a hook a planned step would skip:
    a module backward hook, or, where ``leaf_hooks`` says why this trainer cannot call
    them, a hook on a parameter's or a ``batch`` tensor's gradient."""
    found = module_grad_hooks(model)
    if found:
        raise UnsupportedModelError(
            "outcore runs the backward without autograd and keeps no module's gradients at "
            "its boundary, so these hooks would never be called and the gradients would "
            "differ from eager PyTorch's: " + "; ".join(found) + ". Remove them "
            "(handle.remove()) and apply their effect to p.grad after trainer.step (e.g. "
            "clip or scale the gradients there); hooks on a parameter's gradient "
            "(p.register_hook, p.register_post_accumulate_grad_hook) are called.")
    if leaf_hooks is not None:
        leaves = leaf_grad_hooks(model, batch)
        if leaves:
            raise UnsupportedModelError(
                f"{', '.join(leaves[:5])}{' and more' if len(leaves) > 5 else ''} "
                f"{'carries a hook on its' if len(leaves) == 1 else 'carry hooks on their'} "
                "gradient (register_hook / register_post_accumulate_grad_hook), which this "
                f"trainer would not call: {leaf_hooks}. Remove them "
                "(handle.remove()) and apply their effect to p.grad after trainer.step, or "
                "train with outcore.compile's Trainer, which calls them.")


def forward_hooks(model: nn.Module) -> Hashable:
    """Which forward hooks and forward pre-hooks are registered on ``model``'s modules and
    globally: per module that has any, its name and the handles' ids (unique per
    registration, so a hook removed and another registered differs), then the global ones'.
    Equal fingerprints mean the captured forward ran the hooks in place now."""
    per_module = tuple((name, tuple(mod._forward_pre_hooks), tuple(mod._forward_hooks))
                       for name, mod in model.named_modules()
                       if mod._forward_pre_hooks or mod._forward_hooks)
    return (per_module, tuple(module_mod._global_forward_pre_hooks),
            tuple(module_mod._global_forward_hooks))
