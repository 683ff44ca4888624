"""Dropout in bfloat16 on the CPU (under autocast, or in a bfloat16 model) trains as eager.

Eager's CPU dropout scales by ``1 / (1 - p)`` rounded to the mask's dtype; the traced
``native_dropout`` scales in float (``outcore.capture.traced_as_eager``, item 0d). Found by a
differential fuzz of training loops (session 19): under bfloat16 autocast the conv weight's
gradient differed from eager's by 4.9e-4 after one step, the losses from the second step on
(1.7136 against eager's 1.7173). Float32 keeps ``native_dropout``."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import outcore


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c = nn.Conv2d(3, 8, 3, padding=1)
        self.l = nn.Linear(8 * 16, 32)
        self.d = nn.Dropout(0.1)
        self.fc = nn.Linear(32, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.max_pool2d(torch.relu(self.c(x)), 2).flatten(1)
        return self.fc(self.d(torch.relu(self.l(h))))


def _batches(dtype: torch.dtype) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 3, 8, 8, generator=g).to(dtype), torch.randint(0, 5, (8,), generator=g))
            for _ in range(3)]


def _context(autocast: bool) -> contextlib.AbstractContextManager[object]:
    return torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()


@pytest.mark.parametrize("policy", ["offload-all", "recompute-cheap"])
@pytest.mark.parametrize("autocast", [True, False], ids=["autocast", "bf16-model"])
def test_bfloat16_dropout_steps_equal_eagers(policy: str, autocast: bool) -> None:
    torch.manual_seed(0)
    model = Small() if autocast else Small().to(torch.bfloat16)
    reference = copy.deepcopy(model)
    batches = _batches(torch.float32 if autocast else torch.bfloat16)
    with _context(autocast):
        trainer = outcore.compile(model, F.cross_entropy, batches[0], budget=None,
                                  device="cpu-emulated", policy=policy)
    ours = torch.optim.SGD(model.parameters(), lr=0.1)
    theirs = torch.optim.SGD(reference.parameters(), lr=0.1)
    with trainer:
        for i, (x, y) in enumerate(batches):
            torch.manual_seed(5 + i)
            with _context(autocast):
                got = trainer.step(x, y)
            torch.manual_seed(5 + i)
            with _context(autocast):
                expected = F.cross_entropy(reference(x), y)
            expected.backward()
            assert torch.equal(got, expected.detach()), i
            for (name, p), q in zip(model.named_parameters(), reference.parameters(),
                                    strict=True):
                assert torch.equal(p.grad, q.grad), (i, name)
            ours.step()
            theirs.step()
            ours.zero_grad()
            theirs.zero_grad()


def test_float32_dropout_is_still_traced_as_native_dropout() -> None:
    torch.manual_seed(0)
    graph = outcore.capture(Small(), F.cross_entropy, _batches(torch.float32)[0])
    names = {op.name for op in graph.ops}
    assert "native_dropout" in names
    with torch.autocast("cpu", dtype=torch.bfloat16):
        graph = outcore.capture(Small(), F.cross_entropy, _batches(torch.float32)[0])
    assert "native_dropout" not in {op.name for op in graph.ops}
