"""The model's own ``torch.utils.checkpoint`` calls, traced as plain calls.

outcore decides per tensor what to recompute, so a checkpoint the model places itself (Hugging
Face's ``gradient_checkpointing_enable()``, timm's ``set_grad_checkpointing()``, a hand-written
``checkpoint(block, x)``) only gets in its way: traced as PyTorch runs it, a region's forward
appears twice in the captured step (the recompute in backward) whether or not the budget
needs it. And the reentrant variant (``use_reentrant=True``, which PyTorch 2.13 still takes
when the argument is not given) cannot be traced at all: it calls ``torch.autograd.backward``
inside backward, which the joint trace refuses.

While ``plain_checkpoints()`` is open, both variants run their function once, as a plain call:

* non-reentrant (``use_reentrant=False``): the function with autograd on, as eager's first
  forward of the region runs it; the recompute hooks (``context_fn``, the determinism check)
  are not installed;
* reentrant: the same, except when no tensor argument requires grad. Eager's reentrant
  checkpoint then returns outputs that require no grad (``autograd.Function`` semantics: the
  parameters inside get no gradient, with PyTorch's "None of the inputs have
  requires_grad=True" warning). The function then runs under ``torch.no_grad()``, so the
  step computes what eager computes there too.

Invariant: the values are eager's. A checkpointed region computes the same forward once
instead of twice, and its random ops draw once: eager's recompute replays the RNG state it
saved (``preserve_rng_state``), so its values equal the first forward's. The gradients are
eager's, as every other recompute outcore plans. ``plain_checkpoints`` counts the calls it
flattened (``Flattened.calls``; a trace may run the forward more than once), so the capture
can say whether there were any (``graph.meta["user_checkpoints"]``, a log line).

Relies on two names of ``torch.utils.checkpoint`` in torch 2.13 (``CheckpointFunction`` and
``_checkpoint_without_reentrant_generator``; tests/spine/test_user_checkpoints.py checks both
exist), patched only while the context is open.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils.checkpoint as torch_checkpoint


@dataclass
class Flattened:
    """What ``plain_checkpoints`` flattened while it was open."""

    calls: int = 0


def _requires_grad(args: tuple[Any, ...]) -> bool:
    return any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)


@contextlib.contextmanager
def plain_checkpoints() -> Iterator[Flattened]:
    """Run every ``torch.utils.checkpoint`` call as a plain call while open (module doc)."""
    seen = Flattened()
    reentrant = torch_checkpoint.CheckpointFunction
    own_apply = reentrant.__dict__.get("apply")  # None: inherited from autograd.Function
    saved_generator = torch_checkpoint._checkpoint_without_reentrant_generator

    def plain_reentrant(function: Callable[..., Any], _preserve: bool, *args: Any) -> Any:
        seen.calls += 1
        if _requires_grad(args):
            return function(*args)
        with torch.no_grad():  # eager's outputs require no grad here (module doc)
            return function(*args)

    def plain_generator(*_args: Any, **_kwargs: Any) -> Iterator[None]:
        seen.calls += 1
        yield  # checkpoint() runs the function between its two next() calls

    reentrant.apply = staticmethod(plain_reentrant)  # type: ignore[method-assign,assignment]
    torch_checkpoint._checkpoint_without_reentrant_generator = plain_generator  # type: ignore[assignment]
    try:
        yield seen
    finally:
        if own_apply is None:
            del reentrant.apply
        else:
            reentrant.apply = own_apply  # type: ignore[method-assign]
        torch_checkpoint._checkpoint_without_reentrant_generator = saved_generator
