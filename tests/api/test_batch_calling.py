"""How a batch reaches the model, and batches whose non-tensor leaves change.

Found by a probe (session 23): a model whose forward takes the dict or tuple batch whole
(``forward(self, batch)`` reading ``batch["x"]``, common outside Hugging Face) could not be
trained at all: outcore called ``model(**batch)`` and the capture failed with "unexpected
keyword argument 'x'". And a dict batch that carries a list of sample ids (a collate
function that keeps them) was captured and planned again on every step without a word.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import outcore
from outcore.capture.batching import spread
from outcore.errors import OutcoreError, ReplanWarning
from outcore.trainer import PlannedTrainer


class _Body(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(10, 64)
        self.b = nn.Linear(64, 64)
        self.o = nn.Linear(64, 3)

    def run(self, x: torch.Tensor) -> torch.Tensor:
        return self.o(torch.relu(self.b(torch.relu(self.a(x)))))


class DictWhole(_Body):
    def forward(self, batch: dict[str, Any]) -> torch.Tensor:
        return self.run(batch["x"]) * batch["scale"]


class DictWholeWithFlag(_Body):
    def forward(self, batch: dict[str, Any], train: bool = True) -> torch.Tensor:
        return self.run(batch["x"]) * (batch["scale"] if train else 1.0)


class PairWhole(_Body):
    def forward(self, pair: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, shift = pair
        return self.run(x + shift)


def _dict_loss(out: torch.Tensor, batch: dict[str, Any]) -> torch.Tensor:
    return F.cross_entropy(out, batch["y"])


def _dict_batches(ids: bool = False) -> list[dict[str, Any]]:
    g = torch.Generator().manual_seed(3)
    out = []
    for i in range(3):
        batch: dict[str, Any] = {"x": torch.randn(32, 10, generator=g),
                                 "y": torch.randint(0, 3, (32,), generator=g), "scale": 0.5}
        if ids:
            batch["ids"] = [f"sample-{i}-{j}" for j in range(4)]
        out.append(batch)
    return out


def _pair_batches() -> list[tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]]:
    g = torch.Generator().manual_seed(4)
    return [((torch.randn(32, 10, generator=g), torch.randn(32, 10, generator=g)),
             torch.randint(0, 3, (32,), generator=g)) for _ in range(3)]


def _eager_step(model: nn.Module, loss_fn: Any, batch: Any) -> torch.Tensor:
    if isinstance(batch, dict):
        loss = loss_fn(model(batch), batch)
    else:
        loss = loss_fn(model(batch[0]), batch[1])
    loss.backward()
    return loss.detach()


CASES = {
    "dict-whole": (DictWhole, _dict_loss, _dict_batches),
    "dict-whole-with-a-default": (DictWholeWithFlag, _dict_loss, _dict_batches),
    "tuple-whole": (PairWhole, F.cross_entropy, _pair_batches),
}


@pytest.mark.parametrize("policy", ["offload-all", "outcore-auto"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_forward_taking_the_batch_whole_trains_as_eager(case: str, policy: str) -> None:
    make, loss_fn, batches = CASES[case]
    torch.manual_seed(0)
    ref = make()
    ours = copy.deepcopy(ref)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt_ours = torch.optim.SGD(ours.parameters(), lr=0.1)
    data = batches()
    with outcore.compile(ours, loss_fn, data[0], budget=None, device="cpu-emulated",
                         policy=policy) as trainer:
        for batch in data:
            want = _eager_step(ref, loss_fn, batch)
            got = trainer.step(batch)
            assert torch.equal(got, want)
            for (name, a), b in zip(ref.named_parameters(), ours.parameters(), strict=True):
                assert b.grad is not None and torch.equal(a.grad, b.grad), name
            opt_ref.step()
            opt_ref.zero_grad()
            opt_ours.step()
            opt_ours.zero_grad()
    for a, b in zip(ref.parameters(), ours.parameters(), strict=True):
        assert torch.equal(a, b)


class _Keywords(nn.Module):
    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return x


class _Anything(nn.Module):
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return args, kwargs


class _Two(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b


def test_spread_keeps_the_conventions_where_the_forward_takes_them() -> None:
    t = torch.zeros(1)
    assert spread(_Keywords(), {"x": t, "mask": t})  # Hugging Face: model(**batch)
    assert spread(_Anything(), {"whatever": t})
    assert spread(_Two(), (t, t))  # model(*x)
    assert spread(_Keywords(), (t,))
    assert not spread(DictWhole(), {"x": t, "scale": 1.0})
    assert not spread(DictWholeWithFlag(), {"x": t, "scale": 1.0})
    assert not spread(PairWhole(), (t, t))
    # neither call binds: the convention stays, and its TypeError names the key
    assert spread(_Two(), {"c": t})
    assert spread(_Two(), (t, t, t))


def test_a_key_no_forward_takes_is_still_named() -> None:
    model = _Two()
    with pytest.raises(outcore.CaptureError, match="unexpected keyword argument 'c'"):
        outcore.compile(model, lambda out, batch: out.sum(), {"a": torch.ones(2),
                                                             "c": torch.ones(2)},
                        budget=None, device="cpu-emulated", policy="offload-all")


def _replan_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, ReplanWarning)]


def test_changing_non_tensor_leaves_are_named_when_they_replan() -> None:
    torch.manual_seed(0)
    model = DictWhole()
    data = _dict_batches(ids=True)
    with outcore.compile(model, _dict_loss, data[0], budget=None, device="cpu-emulated",
                         policy="offload-all") as trainer, \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.step(data[0])
        assert _replan_warnings(caught) == []
        trainer.step(data[1])
    messages = _replan_warnings(caught)
    assert len(messages) == 1
    assert "batch['ids'][0], batch['ids'][1], batch['ids'][2] and 1 more" in messages[0]
    assert "drop them from the batch" in messages[0]
    assert trainer.stats.captures == 2


def test_same_tensors_other_shapes_do_not_blame_the_constants() -> None:
    torch.manual_seed(0)
    model = DictWhole()
    data = _dict_batches(ids=True)
    smaller = {**data[0], "x": data[0]["x"][:16], "y": data[0]["y"][:16]}
    with outcore.compile(model, _dict_loss, data[0], budget=None, device="cpu-emulated",
                         policy="offload-all") as trainer, \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.step(data[0])
        trainer.step(smaller)  # a smaller last batch re-plans; its ids did not change
    assert _replan_warnings(caught) == []


def test_a_planned_trainer_names_them_too() -> None:
    torch.manual_seed(0)
    model = DictWhole()
    data = _dict_batches(ids=True)
    with outcore.compile(model, _dict_loss, data[0], budget=None, device="cpu-emulated",
                         policy="offload-all") as trainer:
        trainer.step(data[0])
        fixed = PlannedTrainer(model, trainer.planned, trainer.device, None)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fixed.step(data[0])
            fixed.step(data[1])
    messages = _replan_warnings(caught)
    assert len(messages) == 1 and "batch['ids'][0]" in messages[0]
    assert fixed.stats.replans == 1


class _OwnLoss(_Body):
    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": F.cross_entropy(self.run(x), labels)}


def test_a_planned_trainer_steps_every_batch_form_compile_takes() -> None:
    """``PlannedTrainer.step`` took ``(x, y)`` only: a dict batch (Hugging Face's), a model
    computing its own loss, and any batch with a non-tensor leaf (its batch check counted
    the leaves, not the tensors) could not be stepped."""
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(32, 10, generator=g), torch.randint(0, 3, (32,), generator=g)
    forms: list[tuple[type[nn.Module], Any, tuple[Any, ...]]] = [
        (DictWhole, _dict_loss, ({"x": x, "y": y, "scale": 0.5},)),
        (_OwnLoss, None, ({"x": x, "labels": y},)),
        (PairWhole, F.cross_entropy, ((x, x), y)),
    ]
    for make, loss_fn, args in forms:
        torch.manual_seed(0)
        ref = make()
        ours = copy.deepcopy(ref)
        batch = args[0] if len(args) == 1 else args
        want = (_eager_step(ref, loss_fn, batch) if loss_fn is not None
                else _own_loss_step(ref, batch))
        with outcore.compile(ours, loss_fn, batch, budget=None, device="cpu-emulated",
                             policy="offload-all") as trainer:
            # the planned step binds the captured model's parameters: the same model
            fixed = PlannedTrainer(ours, trainer.planned, trainer.device, None)
            got = fixed.step(*args)
            with torch.no_grad():
                evaluated = fixed.eval_step(*args)
        assert torch.equal(got, want), make.__name__
        assert torch.equal(evaluated, want), make.__name__
        for a, b in zip(ref.parameters(), ours.parameters(), strict=True):
            assert b.grad is not None and torch.equal(a.grad, b.grad), make.__name__


def _own_loss_step(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    loss = model(**batch)["loss"]
    loss.backward()
    return loss.detach()


def test_a_planned_trainer_on_another_model_object_is_refused() -> None:
    # it ran: the planned step trained the captured model, and ``other`` kept no gradients
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    other = copy.deepcopy(model)
    batch = (torch.randn(4, 6), torch.randint(0, 3, (4,)))
    trainer = outcore.compile(model, F.cross_entropy, batch, budget=None,
                              device="cpu-emulated")
    with pytest.raises(OutcoreError, match="captured from another Sequential object"):
        PlannedTrainer(other, trainer.planned, trainer.device, None)
