"""The hooks autograd calls on a leaf's gradient, called by a planned step's commit.

A planned step runs its backward without autograd, so nothing calls the hooks a user put on
a leaf tensor (a parameter, or a batch tensor with ``requires_grad=True``). The commit
(``outcore.runtime.failsafe.commit``) calls them instead, as autograd's ``AccumulateGrad``
does in eager PyTorch:

* ``t.register_hook(fn)`` (a tensor hook on a leaf): ``fn(grad)`` with the step's whole
  gradient of ``t`` (every use of ``t`` summed first, as autograd sums a leaf's
  contributions before accumulating them), before it is added to ``.grad``; a returned
  tensor replaces the gradient for the hooks after it and for ``.grad``. Hooks run in
  registration order, under ``torch.no_grad()``. A returned tensor of another shape, dtype
  or device is refused, as autograd refuses it ("hook has changed the size of value").
* ``t.register_post_accumulate_grad_hook(fn)``: ``fn(t)`` after ``t.grad`` holds the step's
  gradient (an optimizer step per parameter, "optimizer in backward").

Invariant: each hook is called once per step, as once per ``loss.backward()`` in eager,
with the gradient eager would hand it (sub-batches: the sum of theirs, which the step
accumulates before its commit), so ``.grad`` and what the hooks did equal eager's.
Where a step differs from eager: the hooks run after the whole backward, leaf after leaf
in the order the step's backward made the gradients (the engine's, ``_collect``), so a
hook that reads *another* leaf's ``.grad`` sees it already written; the tensor hooks of
every leaf run before any gradient is written (one raising leaves ``.grad`` as it was),
the post-accumulate hooks after every one is (one raising leaves the step's gradients
in ``.grad``, as a raising hook in eager's backward leaves those accumulated before it).

Module backward hooks (``register_full_backward_hook``) read a module's gradients at its
boundary, which a planned step does not keep: ``outcore.capture.hooks`` refuses them.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from outcore.errors import OutcoreError


def has_leaf_hooks(tensor: torch.Tensor) -> bool:
    """Whether autograd would call a hook of ``tensor``'s when its gradient is accumulated."""
    return bool(getattr(tensor, "_backward_hooks", None)
                or getattr(tensor, "_post_accumulate_grad_hooks", None))


def hooked_grad(name: str, leaf: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """``grad`` passed through ``leaf``'s tensor hooks (module doc), checked as autograd
    checks what a hook returns."""
    hooks = getattr(leaf, "_backward_hooks", None)
    if not hooks:
        return grad
    for hook in list(hooks.values()):
        out = hook(grad)
        if out is None:
            continue
        if not isinstance(out, torch.Tensor):
            raise OutcoreError(f"the gradient hook {_named(hook)} of {name!r} returned a "
                               f"{type(out).__name__}; a hook returns a tensor or None")
        for what, was, got in (("size", tuple(grad.shape), tuple(out.shape)),
                               ("dtype", grad.dtype, out.dtype),
                               ("device", grad.device, out.device)):
            if was != got:
                raise OutcoreError(
                    f"the gradient hook {_named(hook)} of {name!r} changed the {what} of the "
                    f"gradient ({was} to {got}); autograd refuses that too. Return a "
                    "gradient like the one the hook was given.")
        grad = out
    return grad


def after_accumulate(leaves: Iterable[torch.Tensor]) -> None:
    """Call each leaf's post-accumulate-grad hooks with the leaf, in the given order."""
    for leaf in leaves:
        hooks = getattr(leaf, "_post_accumulate_grad_hooks", None)
        for hook in list((hooks or {}).values()):
            hook(leaf)


def _named(hook: object) -> str:
    return repr(getattr(hook, "__qualname__", None) or type(hook).__name__)
