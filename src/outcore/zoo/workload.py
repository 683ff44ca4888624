"""The Workload: a model, its loss and an example batch, ready to capture or run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode


@dataclass
class Workload:
    """One training step's ingredients.

    Invariants: ``loss_fn(model(x), y)`` is a scalar for ``(x, y) = batch``; ``model`` is in
    training mode; labels are int64. When built with ``fake=True``, the parameters, buffers and
    batch are FakeTensors of ``fake_mode`` (reuse that mode to trace or size the step).

    Attributes:
        name: the zoo name it was built from (``outcore.zoo.names()``).
        model: the network, in training mode.
        loss_fn: ``loss_fn(model(x), y) -> scalar``.
        batch: ``(x, y)``, what a data loader yields.
        description: what the network is, its source, and the options used.
        fake_mode: the FakeTensorMode holding the tensors, or None for real tensors.
        options: every option the network was built with (defaults filled in).
    """

    name: str
    model: torch.nn.Module
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    batch: tuple[torch.Tensor, torch.Tensor]
    description: str
    fake_mode: FakeTensorMode | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def num_parameters(self) -> int:
        """Number of distinct trainable parameter elements (tied weights counted once)."""
        return sum(p.numel() for p in self.model.parameters() if p.requires_grad)
