"""Tied weights accumulated over steps: ``.grad`` equals eager's bit for bit.

A parameter bound under two names (an LM head tied to the embedding) gets one gradient per
name from the step. The commit added them to ``.grad`` one by one, ``(prior + a) + b``;
autograd sums a leaf's contributions first, ``prior + (a + b)``. Equal on the first step
(no prior), 7.5e-9 apart on the embedding from the second accumulated step on. Found by the
session-20 journey fuzz (SGD with momentum, accumulation over two steps).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import outcore
from outcore.trainer import Trainer


class _TiedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 32)
        self.l = nn.Linear(32, 32)
        self.head = nn.Linear(32, 50, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.l(self.emb(x)))).flatten(0, 1)


def _batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randint(0, 50, (4, 8), generator=g), torch.randint(0, 50, (32,), generator=g))
            for _ in range(n)]


def _trainer(model: nn.Module, batch: tuple, how: str, lr: float = 0.1) -> Trainer:
    """``how``: a policy (unbounded budget), or "weights" (the weights trainer, 10 MB)."""
    if how == "weights":
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        return outcore.compile(model, F.cross_entropy, batch, optimizer=opt, budget="10MB",
                               device="cpu-emulated")
    return outcore.compile(model, F.cross_entropy, batch, budget=None, device="cpu-emulated",
                           policy=how)


@pytest.mark.parametrize("how", ["keep-all", "offload-all", "weights"])
def test_tied_gradients_accumulate_as_eager(how: str) -> None:
    torch.manual_seed(0)
    model = _TiedLM()
    ref = copy.deepcopy(model)
    batches = _batches(3)
    trainer = _trainer(model, batches[0], how)
    with trainer:
        for x, y in batches:
            trainer.step(x, y)
            F.cross_entropy(ref(x), y).backward()
    for (name, p), q in zip(ref.named_parameters(), model.parameters(), strict=True):
        assert p.grad is not None and torch.equal(p.grad, q.grad), name


class _SharedSeq2Seq(nn.Module):
    """BART's and T5's shared embedding in small: one matrix read by an encoder lookup, a
    decoder lookup and the LM head (three names, three uses)."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Embedding(96, 32)
        self.dec = nn.Embedding(96, 32)
        self.head = nn.Linear(32, 96, bias=False)
        self.dec.weight = self.head.weight = self.enc.weight
        self.mix = nn.Linear(32, 32)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        memory = self.mix(self.enc(src)).mean(1, keepdim=True)
        return self.head(torch.tanh(self.dec(tgt) + memory)).flatten(0, 1)


@pytest.fixture
def one_thread():
    """One intra-op thread: each sum then rounds one way (more threads can hide an order)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("how", ["keep-all", "offload-all", "weights"])
def test_three_uses_sum_in_autograds_order(how: str, one_thread) -> None:
    """Autograd's engine adds a leaf's contributions as they arrive (``(head + dec) + enc``
    here); the commit summed them by name (``(enc + dec) + head``), 1 ulp off eager's on
    every seed tried. The executor now hands them over in the order the traced backward made
    them, which is the engine's."""
    g = torch.Generator().manual_seed(2)
    batches = [((torch.randint(0, 96, (2, 12), generator=g),
                 torch.randint(0, 96, (2, 10), generator=g)),
                torch.randint(0, 96, (20,), generator=g)) for _ in range(2)]
    for seed in range(3):
        torch.manual_seed(seed)
        model = _SharedSeq2Seq()
        ref = copy.deepcopy(model)
        with _trainer(model, batches[0], how, lr=0.0) as trainer:
            for (src, tgt), y in batches:
                trainer.step((src, tgt), y)
                F.cross_entropy(ref(src, tgt), y).backward()
        for (name, p), q in zip(ref.named_parameters(), model.parameters(), strict=True):
            assert p.grad is not None and torch.equal(p.grad, q.grad), (seed, name)
