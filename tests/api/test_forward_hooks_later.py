"""A forward hook or forward pre-hook registered (or removed) after a step was captured:
outcore.compile captures the step again and computes what eager computes with the hooks now
in place; a fixed PlannedTrainer refuses the step.

Found by a differential fuzz of training loops (session 19): the Trainer reused the plan
captured without the hook, silently (loss 1.5846 where eager gave 1.6574 with a forward hook
doubling a layer's output registered before the second step)."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import outcore
from outcore.errors import UnsupportedModelError
from outcore.trainer import PlannedTrainer


def _double(module: nn.Module, args: tuple[torch.Tensor, ...], out: torch.Tensor) -> torch.Tensor:
    return out * 2


def _halve_input(module: nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor]:
    return (args[0] * 0.5,)


def _add_forward(model: nn.Module) -> object:
    return model[0].register_forward_hook(_double)


def _add_pre(model: nn.Module) -> object:
    return model[2].register_forward_pre_hook(_halve_input)


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 5))


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    return torch.randn(8, 16), torch.randint(0, 5, (8,))


def _eager(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    loss = F.cross_entropy(model(batch[0]), batch[1])
    loss.backward()
    return loss.detach()


@pytest.mark.parametrize("add", [_add_forward, _add_pre])
def test_a_hook_registered_after_a_step_is_captured_and_computes_as_eager(
        add: Callable[[nn.Module], object]) -> None:
    model = _model()
    reference = copy.deepcopy(model)
    batch = _batch()
    with outcore.compile(model, F.cross_entropy, batch, budget=None, device="cpu-emulated",
                         policy="offload-all") as trainer:
        first = trainer.step(*batch)
        _eager(reference, batch)
        handles = [add(model), add(reference)]
        got = trainer.step(*batch)
        expected = _eager(reference, batch)
        assert torch.equal(got, expected)
        assert not torch.equal(got, first)  # the hook matters, so the test can fail
        for p, q in zip(model.parameters(), reference.parameters(), strict=True):
            assert torch.equal(p.grad, q.grad)
        assert trainer.stats.captures == 2
        for handle in handles:  # removed: back to the first plan, and eager's result
            handle.remove()  # type: ignore[attr-defined]
        assert torch.equal(trainer.step(*batch), first)
        assert trainer.stats.captures == 2


def test_a_hook_removed_and_another_registered_is_captured_again() -> None:
    model = _model()
    batch = _batch()
    handle = model[0].register_forward_hook(_double)
    with outcore.compile(model, F.cross_entropy, batch, budget=None,
                         device="cpu-emulated") as trainer:
        trainer.step(*batch)
        handle.remove()
        model[0].register_forward_hook(lambda m, a, o: o * 3)
        trainer.step(*batch)
        assert trainer.stats.captures == 2


def test_a_global_forward_hook_registered_later_is_captured() -> None:
    model = _model()
    batch = _batch()
    with outcore.compile(model, F.cross_entropy, batch, budget=None,
                         device="cpu-emulated") as trainer:
        trainer.step(*batch)
        handle = nn.modules.module.register_module_forward_hook(
            lambda m, a, o: o * 2 if isinstance(m, nn.ReLU) else None)
        try:
            trainer.step(*batch)
        finally:
            handle.remove()
        assert trainer.stats.captures == 2


def test_planned_trainer_refuses_a_step_after_a_hook_was_registered() -> None:
    model = _model()
    batch = _batch()
    planned = outcore.plan(outcore.capture(model, F.cross_entropy, batch), None,
                           policy="offload-all")
    trainer = PlannedTrainer(model, planned, device=None, budget=None)
    trainer.step(*batch)
    model[0].register_forward_hook(_double)
    with pytest.raises(UnsupportedModelError, match="forward hook"):
        trainer.step(*batch)
