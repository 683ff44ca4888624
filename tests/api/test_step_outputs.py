"""``outcore.compile(..., outputs=True)``: the model's outputs after each step, as eager's.

A training loop reads the model's output for its metrics (accuracy from the logits, a Hugging
Face ``ModelOutput``'s fields); a step returned only the loss, so the metric cost a second
forward. With ``outputs=True`` the captured step keeps copies of what the model returned
(detached) as outputs held to its end, which the plan counts, and ``trainer.outputs`` holds
them in the model's own structure. The class tested: a tensor, a tuple with a string and an
object holding tensors (a key/value cache: given as None, not the trace's object; found on
GPT-2, whose output holds its cache), a dict (the model's own loss in it), under plans that
keep, offload and recompute, over steps and shapes, an evaluation under ``torch.no_grad()``,
through a ``PlannedTrainer`` (data parallel's: ``tests/distributed``). Under sub-batches
(``test_step_outputs_sub_batches.py``): each sub-batch's outputs assembled into the whole
batch's.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from exact import assert_grads_equal
from torch import nn

import outcore
from outcore.trainer import PlannedTrainer


class _Cache:
    """An object holding tensors (a key/value cache): given as None, not the trace's."""

    def __init__(self, held: torch.Tensor) -> None:
        self.held = held


class _Classifier(nn.Module):
    def __init__(self, returns: str = "tensor") -> None:
        super().__init__()
        self.returns = returns
        self.body = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Dropout(0.2),
                                  nn.Linear(16, 16), nn.ReLU())
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> Any:
        features = self.body(x)
        logits = self.head(features)
        if self.returns == "tensor":
            return logits
        if self.returns == "tuple":
            return logits, features, "a label", _Cache(features)
        return {"loss": F.cross_entropy(logits, labels), "logits": logits, "aux": None}


def _batch(seed: int, n: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g)


def _first(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, tuple) else out


def _assert_same(ours: Any, eager: Any, close: bool = False) -> None:
    """``ours`` is eager's output, detached, in its structure: bit for bit, or with
    ``close`` up to float rounding (sums in another order)."""
    if isinstance(eager, torch.Tensor):
        assert isinstance(ours, torch.Tensor) and not ours.requires_grad
        assert ours.shape == eager.shape and ours.dtype == eager.dtype
        if close:
            torch.testing.assert_close(ours, eager.detach(), rtol=1e-5, atol=1e-6)
        else:
            assert torch.equal(ours, eager.detach())
    elif isinstance(eager, dict):
        assert ours.keys() == eager.keys()
        for key in eager:
            _assert_same(ours[key], eager[key], close)
    elif isinstance(eager, tuple):
        assert type(ours) is tuple and len(ours) == len(eager)
        for a, b in zip(ours, eager, strict=True):
            _assert_same(a, b, close)
    elif isinstance(eager, _Cache):
        assert ours is None
    else:
        assert ours == eager


@pytest.mark.parametrize("policy", ["keep-all", "offload-all", "outcore-checkpoint"])
@pytest.mark.parametrize("returns", ["tensor", "tuple"])
def test_outputs_are_eagers_each_step(policy: str, returns: str) -> None:
    torch.manual_seed(0)
    model = _Classifier(returns)
    reference = copy.deepcopy(model)

    def loss_fn(out: Any, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(_first(out), y)

    budget = None if policy == "keep-all" else "20KB"
    with outcore.compile(model, loss_fn, _batch(0), budget=budget, device="cpu-emulated",
                         policy=policy, outputs=True) as trainer:
        for seed, n in ((1, 4), (2, 4), (3, 6)):  # a new shape: captured again, kept too
            for p in (*model.parameters(), *reference.parameters()):
                p.grad = None
            torch.manual_seed(seed)
            loss = trainer.step(*_batch(seed, n))
            torch.manual_seed(seed)
            out = reference(_batch(seed, n)[0])
            expected = loss_fn(out, _batch(seed, n)[1])
            expected.backward()
            assert torch.equal(loss, expected.detach())
            assert_grads_equal(model, reference)
            _assert_same(trainer.outputs, out)
            assert trainer.stats.measured_peak == trainer.stats.predicted_peak


def test_a_models_own_dict_output_and_an_evaluation() -> None:
    torch.manual_seed(0)
    model = _Classifier("dict")
    reference = copy.deepcopy(model)
    x, y = _batch(1)
    with outcore.compile(model, None, {"x": x, "labels": y}, budget=None,
                         device="cpu-emulated", outputs=True) as trainer:
        torch.manual_seed(1)
        trainer.step({"x": x, "labels": y})
        torch.manual_seed(1)
        out = reference(x, y)
        out["loss"].backward()
        _assert_same(trainer.outputs, out)
        model.eval()
        reference.eval()
        with torch.no_grad():
            loss = trainer.step({"x": x, "labels": y})
            out = reference(x, y)
        assert torch.equal(loss, out["loss"])
        _assert_same(trainer.outputs, out)


def test_kept_outputs_are_counted_by_the_plan() -> None:
    """The copies live to the step's end: the predicted peak grows by at least the logits'
    bytes under a plan that keeps everything (and is what the step measures)."""
    torch.manual_seed(0)
    x, y = torch.randn(64, 8), torch.randint(0, 3, (64,))
    peaks = []
    for keep in (False, True):
        graph = outcore.capture(_Classifier(), F.cross_entropy, (x, y), outputs=keep)
        peaks.append(outcore.plan(graph, None, policy="keep-all").predicted_peak)
        roles = [t.source for t in graph.tensors if t.source.startswith("output:")]
        assert roles == (["output:0"] if keep else [])
    assert peaks[1] >= peaks[0] + 64 * 3 * 4


def test_a_planned_trainer_keeps_the_outputs_its_step_was_captured_with() -> None:
    """``PlannedTrainer`` (and the data-parallel trainer built on it) keeps the outputs
    when the planned step was captured with ``outputs=True``, on a new batch signature too
    (planned again keeping them) and in an evaluation."""
    torch.manual_seed(0)
    model = _Classifier("tuple")
    reference = copy.deepcopy(model)

    def loss_fn(out: Any, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(_first(out), y)

    graph = outcore.capture(model, loss_fn, _batch(0), outputs=True)
    planned = outcore.plan(graph, None, policy="offload-all")
    trainer = PlannedTrainer(model, planned, device=None, budget=None)
    assert trainer.keep_outputs
    for seed, n in ((1, 4), (2, 6)):
        torch.manual_seed(seed)
        trainer.step(*_batch(seed, n))
        torch.manual_seed(seed)
        _assert_same(trainer.outputs, reference(_batch(seed, n)[0]))
    model.eval()
    reference.eval()
    with torch.no_grad():  # the eager forward's own output (its cache object too)
        trainer.step(*_batch(3))
        out, want = trainer.outputs, reference(_batch(3)[0])
        _assert_same(out[:3], want[:3])
        assert isinstance(out[3], _Cache)
    plain = PlannedTrainer(model, outcore.plan(outcore.capture(model, loss_fn, _batch(0)),
                                               None, policy="offload-all"),
                           device=None, budget=None)
    assert not plain.keep_outputs and plain.outputs is None


def test_without_outputs_nothing_is_kept() -> None:
    with outcore.compile(_Classifier(), F.cross_entropy, _batch(0), budget=None,
                         device="cpu-emulated") as trainer:
        trainer.step(*_batch(1))
        assert trainer.outputs is None
        assert not [t for t in trainer.planned.graph.tensors
                    if t.source.startswith("output:")]
