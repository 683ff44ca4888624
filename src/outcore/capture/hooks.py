"""User hooks that a planned step would skip, refused before anything runs.

The executor runs the captured ATen graph without autograd, so nothing autograd would call
runs: a tensor hook on a parameter (``p.register_hook``), a post-accumulate-grad hook
(``p.register_post_accumulate_grad_hook``), a module backward hook
(``register_full_backward_hook``, ``register_full_backward_pre_hook``) or a global one.
Forward hooks and forward pre-hooks are traced into the graph like the forward itself, so
the ones in place when a step is captured are the ones it computes with: ``forward_hooks``
fingerprints them for the Trainer's signature (a hook registered or removed after a step was
captured is captured again; ``PlannedTrainer`` refuses the step).
``check_hooks`` raises ``UnsupportedModelError`` naming each hook found and what to do, so
that a step never silently computes gradients other than eager's.
"""

from __future__ import annotations

from collections.abc import Hashable

from torch import nn
from torch.nn.modules import module as module_mod

from outcore.errors import UnsupportedModelError


def grad_hooks(model: nn.Module) -> list[str]:
    """A line per hook that autograd would call in eager PyTorch and a planned step not."""
    found: list[str] = []
    for name, p in model.named_parameters(remove_duplicate=True):
        if getattr(p, "_backward_hooks", None):
            found.append(f"parameter {name!r}: a gradient hook (register_hook)")
        if getattr(p, "_post_accumulate_grad_hooks", None):
            found.append(f"parameter {name!r}: a post-accumulate-grad hook "
                         "(register_post_accumulate_grad_hook)")
    for name, mod in model.named_modules():
        if mod._backward_hooks or mod._backward_pre_hooks:
            found.append(f"module {name or type(model).__name__!r}: a backward hook "
                         "(register_full_backward_hook / register_full_backward_pre_hook)")
    if module_mod._global_backward_hooks or module_mod._global_backward_pre_hooks:
        found.append("a global module backward hook "
                     "(torch.nn.modules.module.register_module_full_backward_hook)")
    return found


def check_hooks(model: nn.Module) -> None:
    """Raise UnsupportedModelError when ``model`` carries a hook a planned step would skip."""
    found = grad_hooks(model)
    if found:
        raise UnsupportedModelError(
            "outcore runs the backward without autograd, so these hooks would never be called "
            "and the gradients would differ from eager PyTorch's: " + "; ".join(found) +
            ". Remove them (handle.remove()) and apply their effect to p.grad after "
            "trainer.step (e.g. clip or scale the gradients there).")


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
