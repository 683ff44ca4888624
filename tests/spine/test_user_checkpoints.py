"""A model's own ``torch.utils.checkpoint`` calls (``outcore.capture.checkpoints``): traced as
plain calls, every variant, with eager's values and gradients and no region traced twice;
torch's checkpoint untouched outside the capture."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint as torch_checkpoint
from torch import nn

import outcore
from outcore.capture import capture
from outcore.capture.checkpoints import plain_checkpoints

#: how the model calls checkpoint: a ``use_reentrant`` value, or None for not given (torch
#: 2.13 then takes the reentrant variant, with a warning)
VARIANTS = [True, False, None]


class Block(nn.Module):
    def __init__(self, checkpointed: bool, reentrant: bool | None, dropout: float = 0.0):
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)
        self.dropout = nn.Dropout(dropout)
        self.checkpointed, self.reentrant = checkpointed, reentrant

    def body(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(self.dropout(torch.relu(self.a(x))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.checkpointed:
            return self.body(x)
        kwargs = {} if self.reentrant is None else {"use_reentrant": self.reentrant}
        return torch_checkpoint.checkpoint(self.body, x, **kwargs)


def net(checkpointed: bool, reentrant: bool | None, dropout: float = 0.0,
        first_checkpointed: bool = False) -> nn.Module:
    torch.manual_seed(0)
    first = Block(first_checkpointed, reentrant) if first_checkpointed else nn.Linear(8, 16)
    stem = nn.Sequential(nn.Linear(8, 16), first) if first_checkpointed else first
    return nn.Sequential(stem, Block(checkpointed, reentrant, dropout),
                         Block(checkpointed, reentrant, dropout), nn.Linear(16, 3))


BATCH = (torch.randn(4, 8, generator=torch.Generator().manual_seed(1)), torch.tensor([0, 2, 1, 0]))


def eager_grads(model: nn.Module, seed: int) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # use_reentrant not given
        loss = F.cross_entropy(model(BATCH[0]), BATCH[1])
        loss.backward()
    return loss.detach(), [p.grad for p in model.parameters()]


def test_the_patched_names_exist_in_this_torch():
    assert isinstance(torch_checkpoint.CheckpointFunction, type)
    assert callable(torch_checkpoint._checkpoint_without_reentrant_generator)


@pytest.mark.parametrize("reentrant", VARIANTS)
@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_checkpointed_models_train_as_eager(reentrant, dropout):
    model = net(True, reentrant, dropout)
    reference = copy.deepcopy(model)
    trainer = outcore.compile(model, F.cross_entropy, BATCH, budget=None, device="cpu")
    for seed in (3, 4):
        torch.manual_seed(seed)
        loss = trainer.step(*BATCH)
        expected, grads = eager_grads(reference, seed)
        assert torch.equal(loss, expected)
        for p, g in zip(model.parameters(), grads, strict=True):
            assert torch.equal(p.grad, g)
    assert trainer.planned.graph.meta["user_checkpoints"] is True


@pytest.mark.parametrize("reentrant", VARIANTS)
def test_no_region_is_traced_twice(reentrant):
    plain = capture(net(False, reentrant), F.cross_entropy, BATCH)
    checkpointed = capture(net(True, reentrant), F.cross_entropy, BATCH)
    assert len(checkpointed.ops) == len(plain.ops)
    assert "user_checkpoints" not in plain.meta


def test_reentrant_without_grad_inputs_leaves_its_parameters_without_grad_as_eager():
    # eager's reentrant checkpoint on the raw batch: no input requires grad, so the outputs do
    # not, and the parameters inside get no gradient (PyTorch warns); the step does the same
    model = net(False, True, first_checkpointed=True)
    model[0][0].requires_grad_(False)  # the block's input then requires no grad
    reference = copy.deepcopy(model)
    trainer = outcore.compile(model, F.cross_entropy, BATCH, budget=None, device="cpu")
    trainer.step(*BATCH)
    _, grads = eager_grads(reference, 0)
    inside = {id(p) for p in model[0][1].parameters()}
    for p, g in zip(model.parameters(), grads, strict=True):
        assert (p.grad is None) == (g is None)
        if id(p) in inside:
            assert p.grad is None
        elif g is not None:
            assert torch.equal(p.grad, g)


def test_checkpoint_outside_the_capture_is_torchs_own():
    calls = []

    def body(x):
        calls.append(1)
        return torch.tanh(x).sum()

    with plain_checkpoints():
        pass
    for reentrant in (True, False):
        calls.clear()
        x = torch.randn(3, requires_grad=True)
        torch_checkpoint.checkpoint(body, x, use_reentrant=reentrant).backward()
        assert len(calls) == 2, "the forward, then the recompute in backward"
    assert "apply" not in torch_checkpoint.CheckpointFunction.__dict__


def test_a_failed_capture_restores_torchs_checkpoint():
    with pytest.raises(RuntimeError), plain_checkpoints():
        raise RuntimeError("the trace failed")
    assert torch_checkpoint._checkpoint_without_reentrant_generator.__module__ == (
        "torch.utils.checkpoint")
    assert "apply" not in torch_checkpoint.CheckpointFunction.__dict__
