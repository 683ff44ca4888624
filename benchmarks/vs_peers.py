"""The peers of ``vs_pytorch.py`` that wrap a model: per-block checkpointing
(``torch.utils.checkpoint``, non-reentrant) and selective checkpointing (torchtitan's "op"
policy: the outputs of matmuls, convolutions and attention saved, everything else
recomputed), applied to every repeated block of a model (transformer layers, ResNet blocks),
or through a Hugging Face model's own ``gradient_checkpointing_enable``."""

from __future__ import annotations

import copy
from collections import Counter
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

#: ATen ops whose outputs selective checkpointing saves (torchtitan-style op list).
SAVE_OPS = {
    torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
    torch.ops.aten.baddbmm.default, torch.ops.aten.convolution.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
}



def _blocks(model: nn.Module) -> list[tuple[nn.Module, str, nn.Module]]:
    """(parent, attribute, block) for every child of a ModuleList/Sequential that is not a
    leaf layer, has parameters and shares its class with a sibling (transformer blocks,
    ResNet blocks)."""
    found = []
    for parent in model.modules():
        if isinstance(parent, (nn.ModuleList, nn.Sequential)):
            kids = list(parent.named_children())
            counts = Counter(type(m) for _, m in kids)
            found.extend((parent, n, m) for n, m in kids if counts[type(m)] >= 2
                         and any(True for _ in m.children())
                         and any(True for _ in m.parameters()))
    return found


class _Checkpointed(nn.Module):
    def __init__(self, block: nn.Module, selective: bool) -> None:
        super().__init__()
        self.block = block
        self.selective = selective

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.selective:
            ctx = partial(create_selective_checkpoint_contexts, _save_policy)
            return checkpoint(self.block, *args, use_reentrant=False, context_fn=ctx, **kwargs)
        return checkpoint(self.block, *args, use_reentrant=False, **kwargs)


def _save_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def wrap_blocks(model: nn.Module, selective: bool) -> tuple[nn.Module, int]:
    """A copy of ``model`` with every repeated block checkpointed (a Hugging Face model
    through its own ``gradient_checkpointing_enable``, with the same checkpoint options)."""
    wrapped = copy.deepcopy(model)
    hf = getattr(wrapped, "model", None)
    if hasattr(hf, "gradient_checkpointing_enable"):
        kwargs: dict[str, Any] = {"use_reentrant": False}
        if selective:
            kwargs["context_fn"] = partial(create_selective_checkpoint_contexts, _save_policy)
        hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        return wrapped, hf.config.n_layer
    blocks = _blocks(wrapped)
    for parent, name, block in blocks:
        setattr(parent, name, _Checkpointed(block, selective))
    return wrapped, len(blocks)
