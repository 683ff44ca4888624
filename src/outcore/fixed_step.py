"""What a trainer that runs one captured step (no signature cache) checks before each step.

``outcore.compile``'s Trainer keys its plan cache on the step signature (``outcore.trainer``)
and captures again when the model changes. ``PlannedTrainer`` (data parallel builds on it)
and ``outcore.weights.WeightTrainer`` run the one step they captured, so a change that
eager PyTorch would compute with must be refused instead of silently ignored:

* each module's ``training`` flag (``model.eval()``, a frozen BatchNorm);
* each parameter's ``requires_grad``, dtype, device and shape (freezing a layer);
* the forward hooks and pre-hooks (``outcore.capture.hooks.forward_hooks``);
* the plain Python values the modules hold (``outcore.capture.python_state``: a dropout
  ``p``, a temperature);
* the autocast: a step under an autocast the step was not captured with (none, or another
  dtype) is refused. A step captured under autocast keeps it when called without one, as
  ``outcore.compile(..., autocast=)`` does. ``without_autocast`` is the context the
  captured step runs in (its casts are explicit ops: an ambient autocast must not recast).

Invariant: ``FixedStep(model, ...).check()`` raises ``UnsupportedModelError`` naming the
first kind of change above whenever the model differs from the state it was built in, in
any of these; it raises nothing when the state is the same (changing a value and setting it
back is allowed). Cost: one pass over the modules and parameters per step.

The batch is another matter: a batch of another shape (the smaller last batch of a
DataLoader without ``drop_last``) is a step eager PyTorch computes like any other, so these
trainers capture and plan it (``ShapeCache``: one planned step per batch signature, at most
``SHAPES`` besides the first, least recently used out; the re-plan is logged on the
``outcore`` logger and shown by ``outcore.progress``). The model state above stays fixed
for every shape.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Generic, TypeVar

import torch
from torch import nn

from outcore.capture.aot import autocast_state
from outcore.capture.batching import announce_constant_replan, split_batch_leaves
from outcore.capture.hooks import check_hooks, forward_hooks
from outcore.capture.python_state import changed, python_state
from outcore.errors import UnsupportedModelError
from outcore.log import info

#: planned batch signatures a fixed-step trainer keeps besides its first (``ShapeCache``)
SHAPES = 4
Entry = TypeVar("Entry")

_WAY_OUT = ("Set it back, or compile a new trainer in the new state (outcore.compile "
            "plans it again).")


Layout = tuple[tuple[tuple[Hashable, ...], ...], tuple[tuple[str, bool], ...]]


def layout(model: nn.Module) -> Layout:
    """Each parameter's (name, requires_grad, dtype, device, shape) and each module's
    (name, training flag), in module order."""
    params = tuple((n, p.requires_grad, p.dtype, p.device.type, tuple(p.shape))
                   for n, p in model.named_parameters())
    modes = tuple((n, m.training) for n, m in model.named_modules())
    return params, modes


class FixedStep:
    """The model state one captured step computes with (module doc)."""

    def __init__(self, model: nn.Module, *extra_roots: Any, way_out: str = _WAY_OUT,
                 batch: Any = None, leaf_hooks: str | None = None) -> None:
        self.model = model
        #: why the trainer cannot call hooks on a leaf's gradient; None: it calls them
        #: (``outcore.capture.hooks.check_hooks``)
        self.leaf_hooks = leaf_hooks
        #: the autocast the step was captured under (from the ambient one and ``batch``)
        self.autocast = autocast_state(None, batch, model)
        self.roots = (model, *extra_roots)
        self.way_out = way_out
        self._layout = layout(model)
        self._python = python_state(*self.roots)
        self._hooks = forward_hooks(model)

    def check(self, batch: Any = None) -> None:
        """Raise ``UnsupportedModelError`` when the model left the captured state (and,
        given the step's ``batch``, when the ambient autocast is not the captured one), or
        carries a backward hook the trainer would not call (``check_hooks``)."""
        check_hooks(self.model, batch, leaf_hooks=self.leaf_hooks)
        if batch is not None:
            now = autocast_state(None, batch, self.model)
            if now is not None and now != self.autocast:
                self._refuse(f"the autocast ({now[1]} on {now[0]}; captured: "
                             f"{'none' if self.autocast is None else self.autocast[1]})")
        params, modes = layout(self.model)
        if modes != self._layout[1]:
            names = [n or "model" for (n, a), (_, b) in zip(modes, self._layout[1],
                                                           strict=False) if a != b]
            self._refuse(f"the training flag of {', '.join(names[:5]) or 'a module'} "
                         "(train()/eval())")
        if params != self._layout[0]:
            names = [str(a[0]) for a, b in zip(params, self._layout[0], strict=False)
                     if a != b]
            self._refuse(f"requires_grad, dtype, device or shape of parameter(s) "
                         f"{', '.join(names[:5]) or '(the parameter list)'}")
        state = python_state(*self.roots)
        if state != self._python:
            names = changed(self.roots, self._python, state)[:5]
            self._refuse(f"the model's Python value(s) {', '.join(names) or '(its attributes)'}"
                         " (hold a value that changes in a tensor buffer: register_buffer)")
        if forward_hooks(self.model) != self._hooks:
            self._refuse("the forward hooks or forward pre-hooks (register hooks before "
                         "planning)")

    def _refuse(self, what: str) -> None:
        raise UnsupportedModelError(
            f"{what} changed after the step was captured, and this trainer runs that one "
            f"captured step, which computes with the state it was captured in. {self.way_out}")


def batch_device_type(batch: Any) -> str:
    """The device type of the batch's first tensor ("cpu" for a batch without one)."""
    tensors, _ = split_batch_leaves(batch)
    return tensors[0].device.type if tensors else "cpu"


def without_autocast(batch: Any) -> torch.autocast:
    """The context a captured step runs in: autocast off for the batch's device type."""
    return torch.autocast(batch_device_type(batch), enabled=False)


def under_autocast(cast: tuple[str, torch.dtype] | None) -> AbstractContextManager[Any]:
    """The context an eager forward runs in to compute as a step captured under ``cast``
    (``autocast_state``'s (device type, dtype), or None: no autocast)."""
    return torch.autocast(cast[0], dtype=cast[1]) if cast is not None else nullcontext()


class ShapeCache(Generic[Entry]):
    """One planned step per batch signature: the first one the trainer was built with, and
    up to ``size`` others, planned by ``prepare(batch)`` on their first step (module doc).

    Invariant: ``entry(batch)`` returns the first entry for every batch ``matches_first``
    accepts (the shapes it was captured for: with sub-batches, ``parts`` times the captured
    one), otherwise the entry planned for ``batch``'s signature, planning it once; an
    evicted entry is given to ``evicted`` (e.g. to close it). ``replans`` counts the
    shapes planned after the first."""

    def __init__(self, first: Entry, matches_first: Callable[[Any], bool],
                 prepare: Callable[[Any], Entry], *, what: str, size: int = SHAPES,
                 evicted: Callable[[Entry], None] | None = None) -> None:
        self.first = first
        self._matches_first = matches_first
        self._prepare = prepare
        self._what = what
        self._size = size
        self._evicted = evicted
        self._first_keys: set[Hashable] = set()
        self._others: OrderedDict[Hashable, Entry] = OrderedDict()
        self.replans = 0

    def entries(self) -> list[Entry]:
        """The first entry and the others, least recently used first."""
        return [self.first, *self._others.values()]

    def entry(self, batch: Any) -> Entry:
        """The planned step for ``batch`` (planned now if its signature is new)."""
        _, key = split_batch_leaves(batch)
        if key in self._first_keys:
            return self.first
        if key in self._others:
            self._others.move_to_end(key)
            return self._others[key]
        if self._matches_first(batch):
            self._first_keys.add(key)
            return self.first
        from outcore import progress

        announce_constant_replan([*self._first_keys, *self._others], key, batch, stacklevel=6)
        info(f"{self._what}: a batch {key.describe()} unlike the planned ones (a smaller "
             "last batch?): capturing and planning it; later batches of this signature "
             "reuse that plan")
        with progress.task(f"planning {self._what} for the batch {key.describe()}"):
            entry = self._prepare(batch)
        self.replans += 1
        self._others[key] = entry
        while len(self._others) > self._size:
            _, old = self._others.popitem(last=False)
            if self._evicted is not None:
                self._evicted(old)
        return entry
