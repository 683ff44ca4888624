"""The fixed-step trainers (``WeightTrainer``, ``PlannedTrainer``) on a DataLoader without
``drop_last``, and ``PlannedTrainer`` in a validation loop, against eager PyTorch.

Found by the session-20 differential fuzz: both refused the smaller last batch of an epoch
with ``BatchMismatchError`` (``outcore.compile``'s Trainer plans it), and
``PlannedTrainer.step`` under ``torch.no_grad()`` was refused. Now a batch of a new
signature is captured and planned on its first step and kept (the next epoch's last batch
reuses the plan), with the model state still fixed; under no_grad the step is the eager
forward. Data parallel's side is in ``tests/distributed/test_ddp_parity.py``.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from test_loop_state import _batches, _budget, _eager_step, _Net
from torch import nn

import outcore
from outcore.trainer import PlannedTrainer

Batch = tuple[torch.Tensor, torch.Tensor]


def _epochs(n: int = 2) -> list[Batch]:
    """``n`` epochs of two batches of 8 and a last one of 3 (the same data each epoch)."""
    full = _batches(3)
    epoch = [full[0], full[1], (full[2][0][:3].clone(), full[2][1][:3].clone())]
    return epoch * n


def _run(step: Callable[..., torch.Tensor], batches: list[Batch]) -> list[torch.Tensor]:
    losses = []
    for i, (x, y) in enumerate(batches):
        torch.manual_seed(10 + i)  # dropout: the same masks in both loops
        losses.append(step(x, y))
    return losses


def _same_state(a: nn.Module, b: nn.Module) -> list[str]:
    return [n for (n, u), v in zip(a.state_dict().items(), b.state_dict().values(),
                                   strict=True) if not torch.equal(u, v)]


@pytest.mark.parametrize("call", ["train_step", "step"])
def test_weight_trainer_trains_a_smaller_last_batch_as_eager(
        call: str, caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    model = _Net()
    ref = copy.deepcopy(model)
    batches = _epochs()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    with outcore.compile(model, F.cross_entropy, batches[0], optimizer=opt,
                         budget=_budget(model, batches[0]), device="cpu-emulated") as trainer:
        held = trainer.held()
        assert held  # some parameters live in host memory

        def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            if call == "train_step":
                return trainer.train_step(x, y)
            loss = trainer.step(x, y)
            opt.step()
            opt.zero_grad()
            return loss

        with caplog.at_level(logging.INFO, logger="outcore"):
            got = _run(step, batches)
        assert trainer.replans == 1  # the last batch, planned once for both epochs
        assert trainer.held() == held  # with the first plan's placement
    want = _run(_eager_step(ref, ref_opt, None), batches)
    assert [torch.equal(a, b) for a, b in zip(got, want, strict=True)] == [True] * 6
    assert _same_state(model, ref) == []
    for k, state in ref_opt.state_dict()["state"].items():
        for field, value in state.items():
            assert torch.equal(opt.state_dict()["state"][k][field], value), (k, field)
    assert sum("unlike the planned ones" in r.message for r in caplog.records) == 1


def _planned(model: nn.Module, batch: Batch) -> PlannedTrainer:
    planned = outcore.plan(outcore.capture(model, F.cross_entropy, batch), None,
                           policy="offload-all")
    return PlannedTrainer(model, planned, device=None, budget=None)


def test_planned_trainer_trains_a_smaller_last_batch_as_eager() -> None:
    torch.manual_seed(0)
    model = _Net()
    ref = copy.deepcopy(model)
    batches = _epochs()
    trainer = _planned(model, batches[0])
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = trainer.step(x, y)
        grads = [p.grad.clone() for p in model.parameters()]
        opt.step()
        opt.zero_grad()
        seen.append(grads)
        return loss

    seen: list[list[torch.Tensor]] = []
    got = _run(step, batches)
    assert trainer.replans == 1
    assert [e.planned.graph.source.signature.tensors[0][0] for e in trainer.entries()] == [
        (8, 3, 8, 8), (3, 3, 8, 8)]
    ref_seen: list[list[torch.Tensor]] = []

    def eager(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = F.cross_entropy(ref(x), y)
        loss.backward()
        ref_seen.append([p.grad.clone() for p in ref.parameters()])
        ref_opt.step()
        ref_opt.zero_grad()
        return loss.detach()

    want = _run(eager, batches)
    assert [torch.equal(a, b) for a, b in zip(got, want, strict=True)] == [True] * 6
    for i, (mine, theirs) in enumerate(zip(seen, ref_seen, strict=True)):
        assert all(torch.equal(a, b) for a, b in zip(mine, theirs, strict=True)), i
    assert _same_state(model, ref) == []


def test_planned_trainer_under_no_grad_is_the_eager_forward() -> None:
    """Validation in eval and in train mode (BatchNorm statistics move as eager's), then
    training on: no gradient, nothing planned."""
    torch.manual_seed(0)
    model = _Net()
    ref = copy.deepcopy(model)
    x, y = _batches(1)[0]
    trainer = _planned(model, (x, y))
    for mode in (False, True):
        model.train(mode)
        ref.train(mode)
        torch.manual_seed(3)
        with torch.no_grad():
            got = trainer.step(x[:5], y[:5])  # any shape: nothing is planned
        torch.manual_seed(3)
        with torch.no_grad():
            want = F.cross_entropy(ref(x[:5]), y[:5])
        assert torch.equal(got, want)
        assert all(p.grad is None for p in model.parameters())
        assert _same_state(model, ref) == []
    assert trainer.stats.eval_steps == 2
    assert trainer.replans == 0
    assert trainer.step(x, y).isfinite()  # and it trains on
