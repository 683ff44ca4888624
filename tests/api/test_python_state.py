"""A Python value the forward reads, changed between steps (a temperature schedule, a flag, a
config attribute, a dropout rate): outcore.compile captures again and computes what eager
computes with the new value; a fixed PlannedTrainer refuses the step.

Found by a differential check (session 18): the Trainer kept computing with the value the
step was captured with, silently (loss 1.5387 against eager's 1.5011 after ``temp`` 1.0 ->
0.5)."""

from __future__ import annotations

import copy
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import outcore
from outcore.errors import ReplanWarning, UnsupportedModelError
from outcore.trainer import PlannedTrainer


class Scheduled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.o = nn.Linear(32, 5)
        self.temp = 1.0
        self.use_extra = False
        self.cfg = types.SimpleNamespace(scale=1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x)) * self.cfg.scale
        if self.use_extra:
            h = h * 2
        return self.o(h) / self.temp


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    return torch.randn(8, 16), torch.randint(0, 5, (8,))


def _pair() -> tuple[Scheduled, Scheduled]:
    torch.manual_seed(0)
    model = Scheduled()
    return model, copy.deepcopy(model)


def _trainer(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]):  # type: ignore[no-untyped-def]
    return outcore.compile(model, F.cross_entropy, batch, budget=None, device="cpu-emulated",
                           policy="offload-all")


def _set(models: tuple[nn.Module, ...], name: str, value: object) -> None:
    for m in models:
        if name == "scale":
            m.cfg.scale = value  # type: ignore[union-attr]
        elif name == "dropout":
            m.drop.p = value  # type: ignore[union-attr]
        else:
            setattr(m, name, value)


@pytest.mark.parametrize(("name", "value"), [("temp", 0.5), ("use_extra", True),
                                             ("scale", 3.0)])
def test_a_changed_value_is_captured_again_and_computes_as_eager(name: str,
                                                                 value: object) -> None:
    model, reference = _pair()
    batch = _batch()
    with _trainer(model, batch) as trainer:
        first = trainer.step(*batch)
        F.cross_entropy(reference(batch[0]), batch[1]).backward()
        _set((model, reference), name, value)
        with pytest.warns(ReplanWarning, match=rf"\.{'scale' if name == 'scale' else name}"):
            got = trainer.step(*batch)
        expected = F.cross_entropy(reference(batch[0]), batch[1])
        expected.backward()
        assert torch.equal(got, expected.detach())
        assert not torch.equal(got, first)  # the value matters, so the test can fail
        for p, q in zip(model.parameters(), reference.parameters(), strict=True):
            assert torch.equal(p.grad, q.grad)
        assert trainer.stats.captures == 2


def test_a_value_set_back_reuses_its_plan() -> None:
    model, _ = _pair()
    batch = _batch()
    with _trainer(model, batch) as trainer:
        trainer.step(*batch)
        model.temp = 0.5
        with pytest.warns(ReplanWarning):
            trainer.step(*batch)
        hits = trainer.stats.cache_hits
        model.temp = 1.0
        trainer.step(*batch)
        assert trainer.stats.captures == 2
        assert trainer.stats.cache_hits == hits + 1


def test_a_fixed_planned_trainer_refuses_a_step_after_a_change() -> None:
    model, _ = _pair()
    batch = _batch()
    with _trainer(model, batch) as trainer:
        trainer.step(*batch)
        planned = trainer.planned
        fixed = PlannedTrainer(model, planned, trainer.device, None)
        fixed.step(*batch)
        model.temp = 0.5
        with pytest.raises(UnsupportedModelError, match=r"Scheduled\.temp"):
            fixed.step(*batch)


def test_the_fingerprint_sees_dropout_rates_and_ignores_tensors() -> None:
    from outcore.capture.python_state import changed, python_state

    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.1))
    before = python_state(model)
    model[0].weight.data.add_(1.0)  # values of tensors are read by the step, not baked in
    assert python_state(model) == before
    model[1].p = 0.3
    after = python_state(model)
    assert after != before
    assert changed((model,), before, after) == ["1.p"]


class SetsOnFirstCall(nn.Module):
    """Sets a value on its first forward (as Hugging Face sets ``config.problem_type``)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 5)
        self.kind: str | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind is None:
            self.kind = "single_label"
        return self.a(x)


def test_a_value_the_first_forward_sets_costs_no_second_capture() -> None:
    batch = _batch()
    with _trainer(SetsOnFirstCall(), batch) as trainer:
        for _ in range(3):
            trainer.step(*batch)
        assert trainer.stats.captures == 1


class CountsCalls(nn.Module):
    """Counts its calls in a Python int: eager's count grows every step, a captured step's
    cannot (it does not run the forward's Python code again)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 5)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.a(x)


def test_a_forward_that_changes_its_python_state_is_warned_about() -> None:
    from outcore.errors import OutcoreWarning

    batch = _batch()
    with pytest.warns(OutcoreWarning, match=r"CountsCalls\.calls"):
        trainer = _trainer(CountsCalls(), batch)
    trainer.close()


def test_a_value_set_once_is_not_warned_about(recwarn: pytest.WarningsRecorder) -> None:
    from outcore.errors import OutcoreWarning

    batch = _batch()
    with _trainer(SetsOnFirstCall(), batch) as trainer:
        trainer.step(*batch)
    assert not [w for w in recwarn if issubclass(w.category, OutcoreWarning)
                and "forward changed" in str(w.message)]


def test_a_weight_of_another_shape_is_captured_again() -> None:
    """A weight replaced by a larger one (a grown vocabulary) whose module attributes were
    left as they were: the parameter's shape is in the signature too."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 5))
    batch = _batch()
    with _trainer(model, batch) as trainer:
        trainer.step(*batch)
        model[2].weight = nn.Parameter(torch.randn(7, 32) * 0.1)
        model[2].bias = nn.Parameter(torch.zeros(7))
        reference = copy.deepcopy(model)
        for p in model.parameters():
            p.grad = None
        loss = trainer.step(*batch)
        assert trainer.stats.captures == 2
    expected = F.cross_entropy(reference(batch[0]), batch[1])
    expected.backward()
    assert torch.equal(loss, expected.detach())
