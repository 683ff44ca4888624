"""Assertions shared by the test packages: a step's gradients are eager's bit for bit.
(``tests/conftest.py`` puts this folder on ``sys.path``: ``from exact import ...``.)"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn


def assert_grads_equal(model: nn.Module, reference: nn.Module) -> None:
    """Every parameter of ``model`` has a gradient exactly where ``reference``'s has one,
    and it is bit-equal to it (parameters zipped in registration order)."""
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            assert torch.equal(p.grad, q.grad), name


def train_against_eager(model: nn.Module, loss_fn: Callable[..., torch.Tensor],
                        batches: Sequence[tuple[Any, Any]], *, peaks: bool = False,
                        **options: Any) -> Any:
    """``outcore.compile(model, loss_fn, batches[0], **options)``, then one step per batch
    ``(x, y)`` against a deep copy of ``model`` run eagerly: the loss and every gradient
    bit-equal (and, with ``peaks``, the measured peak the predicted one). Returns the
    trainer."""
    import outcore

    reference = copy.deepcopy(model)
    trainer = outcore.compile(model, loss_fn, batches[0], **options)
    for x, y in batches:
        for p in (*model.parameters(), *reference.parameters()):
            p.grad = None
        loss = trainer.step(x, y)
        expected = loss_fn(reference(x), y)
        expected.backward()
        assert torch.equal(loss, expected.detach())
        assert_grads_equal(model, reference)
        if peaks:
            assert trainer.stats.measured_peak == trainer.stats.predicted_peak
    return trainer
