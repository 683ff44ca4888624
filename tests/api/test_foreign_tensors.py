"""A step that reads a tensor outcore cannot bind (a plain tensor attribute, a tensor a loss
function closes over) is refused with a CaptureError that says how to hold it (a buffer,
the batch, a loss module), and what it suggests trains as eager.

Found by a differential fuzz of training loops (session 19): class weights in a loss
closure (``lambda o, y: F.cross_entropy(o, y, weight=w)``) failed at compile with FakeTensor's
"Please convert all Tensors to FakeTensors first", and the advice to check that the model
runs eagerly (it does)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import outcore
from outcore.errors import CaptureError


class Scaled(nn.Module):
    def __init__(self, as_buffer: bool) -> None:
        super().__init__()
        self.l = nn.Linear(16, 5)
        if as_buffer:
            self.register_buffer("scale", torch.linspace(0.5, 2, 5))
        else:
            self.scale = torch.linspace(0.5, 2, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l(x) * self.scale


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    return torch.randn(8, 16), torch.randint(0, 5, (8,))


def _compile(model: nn.Module, loss_fn: object) -> object:
    return outcore.compile(model, loss_fn, _batch(), budget=None, device="cpu-emulated",
                           policy="offload-all")


def test_a_plain_tensor_attribute_is_refused_with_the_way_out() -> None:
    torch.manual_seed(0)
    with pytest.raises(CaptureError, match=r"register_buffer"):
        _compile(Scaled(as_buffer=False), F.cross_entropy)


def test_a_tensor_a_loss_closes_over_is_refused_with_the_way_out() -> None:
    torch.manual_seed(0)
    weight = torch.linspace(0.5, 2, 5)
    with pytest.raises(CaptureError, match=r"nn\.CrossEntropyLoss\(weight=w\)"):
        _compile(Scaled(as_buffer=True), lambda o, y: F.cross_entropy(o, y, weight=weight))


def test_the_suggested_forms_train_as_eager() -> None:
    torch.manual_seed(0)
    model = Scaled(as_buffer=True)
    reference = copy.deepcopy(model)
    loss_fn = nn.CrossEntropyLoss(weight=torch.linspace(0.5, 2, 5))
    x, y = _batch()
    with _compile(model, loss_fn) as trainer:  # type: ignore[attr-defined]
        got = trainer.step(x, y)
    expected = loss_fn(reference(x), y)
    expected.backward()
    assert torch.equal(got, expected.detach())
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)
