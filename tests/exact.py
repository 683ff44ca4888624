"""Assertions shared by the test packages: a step's gradients are eager's bit for bit.
(``tests/conftest.py`` puts this folder on ``sys.path``: ``from exact import ...``.)"""

from __future__ import annotations

import torch
from torch import nn


def assert_grads_equal(model: nn.Module, reference: nn.Module) -> None:
    """Every parameter of ``model`` has a gradient exactly where ``reference``'s has one,
    and it is bit-equal to it (parameters zipped in registration order)."""
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            assert torch.equal(p.grad, q.grad), name
