"""The model's own ``torch.utils.checkpoint`` calls, traced as plain calls.

outcore decides per tensor what to recompute, so a checkpoint the model places itself (Hugging
Face's ``gradient_checkpointing_enable()``, timm's ``set_grad_checkpointing()``, a hand-written
``checkpoint(block, x)``, ``checkpoint_wrapper``, ``torch.distributed._composable.checkpoint``)
only gets in its way. Traced as PyTorch runs it, a region's forward appears twice in the
captured step (the recompute in backward) whether or not the budget needs it. The reentrant
variant (``use_reentrant=True``, which PyTorch 2.13 still takes when the argument is not given)
cannot be traced at all: it calls ``torch.autograd.backward`` inside backward, which the joint
trace refuses.

While ``plain_checkpoints()`` is open on a thread, both variants run their function once on
that thread, as a plain call, with what eager's first forward of the region does:

* non-reentrant (``use_reentrant=False``): torch's argument checks (``determinism_check``),
  then the function inside ``context_fn``'s forward context (an autocast there still applies;
  selective checkpointing's caching context too). The recompute context and the
  determinism check of the recompute have nothing to act on;
* reentrant: torch's warning when no tensor argument requires grad, and then the function
  under ``torch.no_grad()``, since eager's outputs require no grad there (its parameters get
  no gradient). Otherwise the outputs an ``autograd.Function`` tracks keep their gradient
  path: a tensor output, or the tensors directly in a tuple output. Tensors nested deeper,
  or in a list or dict, are detached, as eager gives them no gradient.

Invariant: the loss, the gradients and the random stream are eager's, with these
exceptions (``Flattened`` records when the first two apply, and ``capture`` announces them
with a ``CheckpointWarning``; a BatchNorm inside a region is seen by a global forward
pre-hook held only while the region's function runs on the capturing thread):

* eager's recompute runs a region's BatchNorm a second time, so its running statistics are
  updated twice a step; the plain call updates them once, as the model without checkpointing
  does;
* with ``preserve_rng_state=False`` eager's recompute draws new random numbers, so its
  gradients belong to other dropout masks than its loss; the plain call draws once, so the
  gradients are those of the loss;
* eager raises where a region's input is changed in place, or (reentrant) no output
  requires grad; the plain call trains;
* a weight used by two reentrant regions gets one summed contribution, where eager adds
  each region's into ``.grad`` in turn: equal up to rounding.

Threads: the two torch names are replaced while any thread has the context open (counted
under a lock). The replacements take the plain path only on a thread that has it open, and
call torch's own functions on every other thread, so eager checkpoints elsewhere in the
process are untouched, and the names are restored when the last context closes.

Relies on names of ``torch.utils.checkpoint`` in torch 2.13 (``CheckpointFunction``,
``_checkpoint_without_reentrant_generator``, ``_allowed_determinism_checks_to_fns``,
``check_backward_validity``) and on the copy of the generator's name that
``torch.distributed._composable.checkpoint_activation`` imports.
tests/spine/test_user_checkpoints.py checks that they exist.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils.checkpoint as torch_checkpoint
from torch.utils._pytree import tree_map

from outcore.capture.patching import SharedPatch

#: Modules holding their own reference to the non-reentrant generator, patched when loaded.
GENERATOR_COPIES = ("torch.distributed._composable.checkpoint_activation",)


@dataclass
class Flattened:
    """What ``plain_checkpoints`` flattened on its thread while it was open."""

    #: plain calls made (a trace may run the forward more than once)
    calls: int = 0
    #: a region was checkpointed with ``preserve_rng_state=False``
    fresh_draws: bool = False
    #: a BatchNorm that updates running statistics ran inside a region
    batchnorm: bool = False


#: torch's own, taken when this module is imported (before any replacement)
_TORCH_APPLY = torch.autograd.Function.__dict__["apply"]  # CheckpointFunction inherits it
_TORCH_GENERATOR = torch_checkpoint._checkpoint_without_reentrant_generator


def _here() -> Flattened | None:
    """The innermost ``Flattened`` of this thread, or None when it has no context open."""
    stack = _PATCH.current()
    return stack[-1] if stack else None


@contextlib.contextmanager
def _watching_batchnorm(seen: Flattened) -> Iterator[None]:
    """Set ``seen.batchnorm`` when a BatchNorm updating its running statistics runs on this
    thread inside the block (a global forward pre-hook, removed when the block ends; it
    returns None, so the forward is the same)."""
    thread = threading.get_ident()

    def hook(module: torch.nn.Module, _args: Any) -> None:
        if (threading.get_ident() == thread
                and isinstance(module, torch.nn.modules.batchnorm._BatchNorm)
                and module.training and module.track_running_stats):
            seen.batchnorm = True

    handle = torch.nn.modules.module.register_module_forward_pre_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def _requires_grad(args: tuple[Any, ...]) -> bool:
    return any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)


def _detached(value: Any) -> Any:
    return tree_map(lambda t: t.detach() if isinstance(t, torch.Tensor) else t, value)


def _as_function_outputs(out: Any) -> Any:
    """``out`` with only what an ``autograd.Function`` tracks still attached."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, tuple):
        return tuple(o if isinstance(o, torch.Tensor) else _detached(o) for o in out)
    return _detached(out)


def _reentrant_apply(function: Callable[..., Any], preserve: bool, *args: Any) -> Any:
    """``CheckpointFunction.apply``: torch's own on other threads, else a plain call."""
    seen = _here()
    if seen is None:
        return _TORCH_APPLY.__get__(None, torch_checkpoint.CheckpointFunction)(
            function, preserve, *args)
    seen.calls += 1
    seen.fresh_draws |= not preserve
    torch_checkpoint.check_backward_validity(args)  # eager's warning
    with _watching_batchnorm(seen):
        if not _requires_grad(args):
            with torch.no_grad():  # eager's outputs require no grad here (module doc)
                return function(*args)
        return _as_function_outputs(function(*args))


def _non_reentrant_generator(fn: Callable[..., Any], preserve_rng_state: bool = True,
                             context_fn: Callable[[], Any] = torch_checkpoint.noop_context_fn,
                             determinism_check: str = torch_checkpoint._DEFAULT_DETERMINISM_MODE,
                             debug: bool = False, early_stop: bool = True, *args: Any,
                             **kwargs: Any) -> Iterator[None]:
    """torch's generator on other threads; here its checks and the forward context only."""
    seen = _here()
    if seen is None:
        yield from _TORCH_GENERATOR(fn, preserve_rng_state, context_fn, determinism_check,
                                    debug, early_stop, *args, **kwargs)
        return
    allowed = torch_checkpoint._allowed_determinism_checks_to_fns
    if determinism_check not in allowed:
        raise ValueError(f"determinism_check should be one of {list(allowed)}, but got "
                         f"{determinism_check}")
    seen.calls += 1
    seen.fresh_draws |= not preserve_rng_state
    forward_context, _recompute_context = context_fn()
    with forward_context, _watching_batchnorm(seen):
        yield  # checkpoint() runs the function between its two next() calls


def _install() -> None:
    if "apply" in torch_checkpoint.CheckpointFunction.__dict__:
        raise RuntimeError("torch.utils.checkpoint.CheckpointFunction defines its own apply: "
                           "outcore.capture.checkpoints is written for torch 2.13's, which "
                           "inherits autograd.Function's")
    torch_checkpoint.CheckpointFunction.apply = staticmethod(_reentrant_apply)  # type: ignore[method-assign,assignment]
    _set_generator(_non_reentrant_generator)


def _set_generator(generator: Callable[..., Iterator[None]]) -> None:
    torch_checkpoint._checkpoint_without_reentrant_generator = generator  # type: ignore[assignment]
    for name in GENERATOR_COPIES:
        module = sys.modules.get(name)
        attribute = "_checkpoint_without_reentrant_generator"
        if module is not None and getattr(module, attribute, None) in (
                _TORCH_GENERATOR, _non_reentrant_generator):
            setattr(module, attribute, generator)


def _restore() -> None:
    del torch_checkpoint.CheckpointFunction.apply  # inherited again
    _set_generator(_TORCH_GENERATOR)


#: torch's checkpoint names replaced while any context is open; this thread's Flattened stack
_PATCH: SharedPatch[Flattened] = SharedPatch(_install, _restore)


def announce_checkpoints(seen: Flattened) -> None:
    """Say that the model's checkpoints were traced as plain calls, with a
    ``CheckpointWarning`` where eager's recompute computes something else (module doc)."""
    from outcore.errors import CheckpointWarning
    from outcore.log import announce, info

    info("the model's torch.utils.checkpoint calls were traced as plain calls: outcore plans "
         "what to recompute")
    if seen.fresh_draws:
        announce("a torch.utils.checkpoint region is called with preserve_rng_state=False: if "
                 "it draws random numbers (dropout), eager's recompute draws new ones, so "
                 "eager's gradients belong to other masks than its loss; outcore's step "
                 "draws once and computes the gradients of its loss", CheckpointWarning)
    if seen.batchnorm:
        announce("a BatchNorm runs inside a region the model checkpoints itself "
                 "(torch.utils.checkpoint): eager's recompute updates its running statistics "
                 "a second time each step; outcore's step updates them once, as the model "
                 "without checkpointing does", CheckpointWarning)


@contextlib.contextmanager
def plain_checkpoints() -> Iterator[Flattened]:
    """Run this thread's ``torch.utils.checkpoint`` calls as plain calls while open (module
    doc); yields what it flattened."""
    with _PATCH.opened(Flattened()) as seen:
        yield seen
