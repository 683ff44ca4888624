"""Example batches and loss functions: what a data loader would yield, and how it is scored.

Each batch maker takes the resolved options of a zoo entry, the batch size and a seeded
``torch.Generator``, and returns ``(x, y)`` with float32 inputs and int64 labels. Inside a
``FakeTensorMode`` the same calls give fake tensors with the same shapes and dtypes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from outcore.zoo.layers import pair

Batch = tuple[torch.Tensor, torch.Tensor]


def image_batch(opts: Mapping[str, Any], batch_size: int, gen: torch.Generator) -> Batch:
    """RGB images (batch, 3, H, W) and class labels (batch,) in [0, num_classes)."""
    h, w = pair(opts["image_size"])
    x = torch.randn(batch_size, 3, h, w, generator=gen)
    y = torch.randint(0, opts["num_classes"], (batch_size,), generator=gen)
    return x, y


def segmentation_batch(opts: Mapping[str, Any], batch_size: int, gen: torch.Generator) -> Batch:
    """RGB images (batch, 3, H, W) and per-pixel labels (batch, H, W) in [0, num_classes)."""
    h, w = pair(opts["image_size"])
    x = torch.randn(batch_size, 3, h, w, generator=gen)
    y = torch.randint(0, opts["num_classes"], (batch_size, h, w), generator=gen)
    return x, y


def vector_batch(opts: Mapping[str, Any], batch_size: int, gen: torch.Generator) -> Batch:
    """Feature vectors (batch, in_features) and class labels (batch,)."""
    x = torch.randn(batch_size, opts["in_features"], generator=gen)
    y = torch.randint(0, opts["num_classes"], (batch_size,), generator=gen)
    return x, y


def token_batch(opts: Mapping[str, Any], batch_size: int, gen: torch.Generator) -> Batch:
    """Token ids (batch, seq_len) and next-token targets (batch, seq_len): one random text
    of seq_len + 1 tokens per row, the target being the input shifted left by one."""
    text = torch.randint(0, opts["vocab"], (batch_size, opts["seq_len"] + 1), generator=gen)
    return text[:, :-1].clone(), text[:, 1:].clone()


def cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy; logits (batch, classes[, H, W]) against labels (batch[, H, W]).

    With segmentation logits this is the per-pixel cross-entropy averaged over all pixels.
    """
    return F.cross_entropy(logits, target)


def lm_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy; logits (batch, seq, vocab), targets (batch, seq)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def clip_batch(opts: Mapping[str, Any], batch_size: int, gen: torch.Generator) -> Batch:
    """Video clips (batch, 3, frames, H, W) and class labels (batch,)."""
    h, w = pair(opts["image_size"])
    x = torch.randn(batch_size, 3, opts["frames"], h, w, generator=gen)
    y = torch.randint(0, opts["num_classes"], (batch_size,), generator=gen)
    return x, y
