"""A training step with nothing to differentiate (every parameter frozen, no batch tensor
requiring grad): eager's ``loss.backward()`` raises, so ``trainer.step`` raises too, instead
of returning a loss with no gradient behind it (found by the session-19 loop fuzz: outcore
returned the loss silently). Frozen parameters with a batch that requires grad (an
adversarial example's gradient) still train, as in eager."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import outcore
from outcore.errors import NothingToTrainError


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _batch():
    torch.manual_seed(1)
    return torch.randn(6, 8), torch.randint(0, 4, (6,))


def _frozen(model: nn.Module) -> nn.Module:
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def test_a_step_with_every_parameter_frozen_raises_as_eager_does():
    x, y = _batch()
    eager = _frozen(_model())
    with pytest.raises(RuntimeError, match="does not require grad"):
        F.cross_entropy(eager(x), y).backward()
    trainer = outcore.compile(_frozen(_model()), F.cross_entropy, (x, y), budget="1GiB",
                              device="cpu-emulated")
    with pytest.raises(NothingToTrainError, match="nothing in this step requires grad") as info:
        trainer.step(x, y)
    assert isinstance(info.value, RuntimeError)  # caught where eager's error is caught
    assert trainer.stats.steps == 0


def test_evaluation_under_no_grad_and_unfreezing_still_work():
    x, y = _batch()
    model = _frozen(_model())
    trainer = outcore.compile(model, F.cross_entropy, (x, y), budget="1GiB", device="cpu-emulated")
    with torch.no_grad():
        loss = trainer.step(x, y)
    assert torch.equal(loss, F.cross_entropy(model(x), y))
    model[2].weight.requires_grad_(True)
    twin = copy.deepcopy(model)
    trainer.step(x, y)
    F.cross_entropy(twin(x), y).backward()
    assert torch.equal(model[2].weight.grad, twin[2].weight.grad)
    assert model[0].weight.grad is None


def test_frozen_parameters_with_a_batch_that_requires_grad_train_the_batch():
    x, y = _batch()
    model = _frozen(_model())
    trainer = outcore.compile(model, F.cross_entropy, (x, y), budget="1GiB", device="cpu-emulated")
    ours, theirs = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    trainer.step(ours, y)
    F.cross_entropy(model(theirs), y).backward()
    assert torch.equal(ours.grad, theirs.grad)
