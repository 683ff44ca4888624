"""Shared by the sub-batch tests: a small conv net whose activations dwarf its input and
weights (so a split step leaves room for the whole batch's outputs and input gradients),
and a budget just under the whole batch's lowest peak (so the step must split)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import outcore


def conv_net(seed: int = 0) -> nn.Module:
    """Two 3x3 convolutions of 16 channels, pooled to 4x4, then a linear head of 10."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
                         nn.Flatten(), nn.Linear(16 * 16, 10))


def below_the_whole_batch(model: nn.Module, loss_fn: Any, batch: Any, device: str,
                          fraction: float = 0.9, **options: Any) -> int:
    """``fraction`` of the lowest peak any plan of the whole batch's activations reaches on
    ``device`` (its kernels' temporaries included where measured), read from the refusal of
    a 1-byte budget: below it a split step fits, and on these nets nothing else does (moDNN
    also offloads gradients and can go lower on other models; the tests assert the split)."""
    try:
        outcore.compile(model, loss_fn, batch, budget=1, device=device, **options)
    except outcore.InfeasibleBudgetError as exc:
        return int(fraction * (exc.lowest or exc.required))
    raise AssertionError("a budget of 1 byte was accepted")
