"""Eager sub-batch reference whose random ops use rows of the full batch's draw.

outcore's sub-batches draw eager's random numbers (``outcore.runtime.sub_batch_rng``). The
eager reference of a sub-batched step with batch statistics (BatchNorm per sub-batch) must do
the same, written independently here: one full-batch forward records each random op's draw
(dropout's mask, bernoulli's sample) in call order; then each sub-batch's eager step replaces
the n-th random call by rows ``i`` of the n-th recorded draw (batch-first models only).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_aten = torch.ops.aten


def _kind(func: Any) -> str | None:
    name = func.overloadpacket.__name__
    if name == "native_dropout":
        return "dropout"
    if name in ("bernoulli", "bernoulli_"):
        return name
    return None


class Record(TorchDispatchMode):
    """Records the random part of each dropout/bernoulli call, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.draws: list[torch.Tensor] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        kind = _kind(func)
        if kind == "dropout":
            self.draws.append(out[1].clone())
        elif kind is not None:
            self.draws.append(out.clone())
        return out


class Replay(TorchDispatchMode):
    """Replaces the n-th random call by rows ``index`` (of ``parts``) of ``draws[n]``."""

    def __init__(self, draws: list[torch.Tensor], index: int, parts: int) -> None:
        super().__init__()
        self.draws, self.index, self.parts, self.n = draws, index, parts, 0

    def _rows(self) -> torch.Tensor:
        full = self.draws[self.n]
        self.n += 1
        b = full.shape[0] // self.parts
        return full[self.index * b:(self.index + 1) * b]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        kind = _kind(func)
        if kind == "dropout":
            x, p = args[0], float(args[1])
            if len(args) > 2 and args[2] is False:
                return func(*args, **kwargs)
            mask = self._rows()
            scale = 0.0 if p == 1.0 else 1.0 / (1.0 - p)
            return x.mul(mask).mul_(scale), mask
        if kind == "bernoulli_":
            return args[0].copy_(self._rows())
        if kind == "bernoulli":
            return self._rows().clone()
        return func(*args, **kwargs)


def record_draws(forward: Any) -> list[torch.Tensor]:
    """Run ``forward()`` (the full batch, no grad) and return its random draws in order."""
    with torch.no_grad(), Record() as rec:
        forward()
    return rec.draws
