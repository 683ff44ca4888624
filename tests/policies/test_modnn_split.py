"""moDNN's sub-batch split on models whose batch is not simply dimension 0 everywhere:
squeeze-excitation (the depthwise-convolution bug), attention batch-first and batch-second,
a batch reshaped into another dimension, a sum-reduced loss; and the refusals
(``outcore.graph.batch_dims``): batch statistics, ambiguous layouts, batch-dependent code."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import outcore
from outcore.api import cost_model_for
from outcore.capture import capture
from outcore.errors import InfeasibleBudgetError
from outcore.graph.batch_dims import BatchDimError, follow, input_batch_dims
from outcore.policies import PolicyContext
from outcore.policies.modnn import minimum_memory
from outcore.policies.registry import get
from outcore.runtime.subbatch import split_batch


class SqueezeExcite(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.down, self.up = nn.Conv2d(c, c // 4, 1), nn.Conv2d(c // 4, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = x.mean((2, 3), keepdim=True)
        return x * F.hardsigmoid(self.up(F.relu(self.down(w))))


def mobilenet_se() -> nn.Module:
    """A MobileNetV3-style block stack: depthwise convolutions and squeeze-excitation."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.Hardswish(),
        nn.Conv2d(16, 16, 3, padding=1, groups=16), SqueezeExcite(16), nn.Conv2d(16, 24, 1),
        nn.Hardswish(), nn.Conv2d(24, 24, 3, stride=2, padding=1, groups=24),
        SqueezeExcite(24), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(24, 5))


class Attention(nn.Module):
    def __init__(self, batch_first: bool) -> None:
        super().__init__()
        self.batch_first = batch_first
        self.attn = nn.MultiheadAttention(12, 3, batch_first=batch_first)
        self.head = nn.Linear(12, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.attn(x, x, x, need_weights=False)
        return self.head(h.mean(1 if self.batch_first else 0))


class BatchIntoRows(nn.Module):
    """(B, T, E) -> time-major (T, B, E) -> rows (T*B, E) -> linear -> back: the batch is
    an inner factor of a merged dimension on the way."""

    def __init__(self) -> None:
        super().__init__()
        self.proj, self.head = nn.Linear(6, 10), nn.Linear(10, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, e = x.shape
        rows = x.transpose(0, 1).reshape(t * b, e)
        h = torch.tanh(self.proj(rows)).reshape(t, b, -1).transpose(0, 1)
        return self.head(h.sum(1))


def batches() -> dict[str, tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]]:
    torch.manual_seed(0)
    y = torch.randint(0, 5, (4,))
    return {
        "squeeze-excitation": (mobilenet_se(), (torch.randn(4, 3, 12, 12), y)),
        "attention batch-first": (Attention(True), (torch.randn(4, 7, 12), y)),
        "attention batch-second": (Attention(False), (torch.randn(7, 4, 12), y)),
        "batch reshaped into rows": (BatchIntoRows(), (torch.randn(4, 3, 6), y)),
    }


def mmin(model: nn.Module, loss_fn, batch, **options) -> int:
    graph = capture(model, loss_fn, batch)
    dims = options.get("batch_dims")

    def rec(k: int):
        return capture(model, loss_fn, split_batch(batch, k, dims)[0])

    ctx = PolicyContext(budget=None, cost=cost_model_for(None), recapture=rec, options=options)
    return minimum_memory(graph, ctx).minimum


def eager_grads(model, loss_fn, batch):
    model = copy.deepcopy(model)
    loss = loss_fn(model(batch[0]), batch[1])
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("name", list(batches()))
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_sub_batches_at_mmin_give_the_full_batch_gradient(name, reduction):
    """At Mmin moDNN splits the batch into sub-batches; the accumulated gradient is the
    full batch's (sum order aside), with every algorithm moDNN may pick (the depthwise
    convolutions of squeeze-excitation nets used to get the FFT kernel and crash)."""
    model, batch = batches()[name]

    def loss_fn(out, y):
        return F.cross_entropy(out, y, reduction=reduction)

    loss, expected = eager_grads(model, loss_fn, batch)
    trained = copy.deepcopy(model)
    budget = mmin(trained, loss_fn, batch)
    with outcore.compile(trained, loss_fn, batch, budget=budget, device="cpu-emulated",
                         policy="modnn") as trainer:
        assert trainer.planned.plan.sub_batches > 1
        got = trainer.step(*batch)
        assert trainer.stats.measured_peak == trainer.stats.predicted_peak <= budget
    assert torch.allclose(got, loss, atol=1e-5)
    for n, p in trained.named_parameters():
        assert torch.allclose(p.grad, expected[n], atol=1e-5, rtol=1e-4), n


@pytest.mark.parametrize(("shapes", "size", "dims"), [
    ([(8, 3, 5), (8,)], 8, (0, 0)),             # batch-first
    ([(7, 8, 12), (8,)], 8, (1, 0)),            # batch-second, labels batch-first
    ([(8, 8, 3), (8,)], 8, (0, 0)),             # first dimensions agree: batch-first
    ([(5, 8), (8, 2), (3, 8, 1)], 8, (1, 0, 1)),
])
def test_input_batch_dims(shapes, size, dims):
    assert input_batch_dims(shapes) == (size, dims) or input_batch_dims(shapes).dims == dims
    assert input_batch_dims(shapes).size == size


@pytest.mark.parametrize("shapes", [
    [(7, 8, 8), (8,)],       # batch-second but the input has the batch size twice
    [(6, 4), (4, 6)],        # two sizes shared by every input
    [(), (4,)],              # a scalar input
    [(3, 5), (4,)],          # nothing shared
])
def test_ambiguous_layouts_are_refused_naming_the_options(shapes):
    with pytest.raises(BatchDimError, match="batch_dims="):
        input_batch_dims(shapes)
    # the explicit layout settles it where it is consistent
    if shapes == [(7, 8, 8), (8,)]:
        assert input_batch_dims(shapes, dims=(1, 0)).dims == (1, 0)


def test_follow_scales_the_merged_dimension_and_finds_batch_statistics():
    model, batch = batches()["batch reshaped into rows"]
    full = capture(model, F.cross_entropy, batch)
    dims = follow(full, capture(model, F.cross_entropy, split_batch(batch, 2)[0]), 2)
    assert not dims.coupled
    merged = [t for t in full.tensors if t.shape == (12, 6)]  # (T*B, E)
    assert merged and all(dims.scales[t.id] == 0 for t in merged)
    assert all(t.id not in dims.scales for t in full.tensors if t.kind == "parameter")
    bn = nn.Sequential(nn.Linear(6, 4), nn.BatchNorm1d(4), nn.Linear(4, 5))
    x, y = torch.randn(4, 6), batch[1]
    coupled = follow(capture(bn, F.cross_entropy, (x, y)),
                     capture(bn, F.cross_entropy, (x[:2], y[:2])), 2).coupled
    assert coupled, "batch_norm's statistics couple the samples"


class Centered(nn.Module):
    """Subtracts the batch mean: samples are coupled without any BatchNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x - x.mean(0, keepdim=True))


class HardCoded(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.reshape(4, 6))  # breaks at any other batch size


@pytest.mark.parametrize("model", [Centered(), nn.Sequential(nn.Linear(6, 4),
                                                               nn.BatchNorm1d(4)), HardCoded()])
def test_models_whose_split_changes_the_step_are_not_split(model):
    """A budget below the full-batch minimum is refused: moDNN does not silently train
    sub-batches whose gradient is not the full batch's."""
    batch = (torch.randn(4, 6), torch.randint(0, 4, (4,)))
    graph = capture(model, F.cross_entropy, batch)
    why = "cannot be captured" if isinstance(model, HardCoded) else "sub_batch_statistics=True"
    ctx = PolicyContext(budget=1, cost=cost_model_for(None), recapture=lambda k: capture(
        model, F.cross_entropy, split_batch(batch, k)[0]))
    with pytest.raises(InfeasibleBudgetError, match=why):  # the policy alone, no opt-in
        get("modnn").fn(graph, ctx)
    if not isinstance(model, HardCoded):  # statistics per sub-batch, when asked for
        out = outcore.plan(graph, mmin(model, F.cross_entropy, batch, sub_batch_statistics=True),
                           policy="modnn", simulate=False, sub_batch_statistics=True,
                           recapture=lambda k: capture(model, F.cross_entropy,
                                                       split_batch(batch, k)[0]))
        assert out.plan.sub_batches > 1
