"""``outcore.compile(..., optimizer=opt, outputs=True)``: the weights trainer keeps what the
model returned, as ``outcore.compile``'s Trainer does (it was refused): after ``train_step``
and ``step``, on a smaller last batch (planned again), and after an evaluation under
``torch.no_grad()``, equal to eager's forward in the same loop, with some parameters held
in host memory. The plan counts the kept copies (held to the step's end)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from test_loop_state import _batches, _budget, _Net

import outcore


@pytest.mark.parametrize("call", ["train_step", "step"])
def test_the_weights_trainer_keeps_the_models_outputs(call: str) -> None:
    torch.manual_seed(0)
    model = _Net()
    reference = copy.deepcopy(model)
    batches = _batches(3)
    batches[2] = (batches[2][0][:3].clone(), batches[2][1][:3].clone())  # a last batch of 3
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    with outcore.compile(model, F.cross_entropy, batches[0], optimizer=opt, outputs=True,
                         budget=_budget(model, batches[0]), device="cpu-emulated") as trainer:
        assert trainer.held()  # some parameters live in host memory
        assert [t.source for t in trainer.graph.tensors
                if t.source.startswith("output:")] == ["output:0"]
        for i, (x, y) in enumerate(batches):
            torch.manual_seed(10 + i)  # dropout: the same masks in both loops
            if call == "train_step":
                loss = trainer.train_step(x, y)
            else:
                loss = trainer.step(x, y)
                opt.step()
                opt.zero_grad()
            torch.manual_seed(10 + i)
            out = reference(x)
            want = F.cross_entropy(out, y)
            want.backward()
            ref_opt.step()
            ref_opt.zero_grad()
            assert torch.equal(loss, want.detach())
            assert isinstance(trainer.outputs, torch.Tensor)
            assert not trainer.outputs.requires_grad
            assert torch.equal(trainer.outputs, out.detach()), i
        model.eval()
        reference.eval()
        with torch.no_grad():
            trainer.step(*batches[0])
            assert torch.equal(trainer.outputs, reference(batches[0][0]))


def test_without_outputs_the_weights_trainer_keeps_none() -> None:
    model = _Net()
    batch = _batches(1)[0]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with outcore.compile(model, F.cross_entropy, batch, optimizer=opt,
                         budget=_budget(model, batch), device="cpu-emulated") as trainer:
        trainer.train_step(*batch)
        assert trainer.outputs is None
        assert not [t for t in trainer.graph.tensors if t.source.startswith("output:")]
