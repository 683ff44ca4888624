"""Regression tests of issue 21's cases, each reproducing the report first: BatchNorm on the
raw input (3), input gradients (5), a smaller last batch (8), the model's own training flags
and user hooks (9), a bfloat16 model on a profile without bfloat16 (10)."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from matrix_models import FrozenBackbone
from split_helpers import below_the_whole_batch, conv_net
from torch import nn

import outcore
from outcore.errors import (
    EvalModeWarning,
    InfeasibleBudgetError,
    OutcoreError,
    ProfileDtypeWarning,
    UnsupportedModelError,
)
from outcore.trainer import PlannedTrainer


def mlp(*extra: nn.Module) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*extra, nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 4))


def data(n: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    return torch.randn(n, 20), torch.randint(0, 4, (n,))


def eager(model: nn.Module, x: torch.Tensor, y: torch.Tensor, seed: int = 5) -> torch.Tensor:
    torch.manual_seed(seed)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    return loss.detach()


def assert_grads_equal(a: nn.Module, b: nn.Module) -> None:
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=name)
    for (name, b1), b2 in zip(a.named_buffers(), b.buffers(), strict=True):
        torch.testing.assert_close(b1, b2, msg=name)


@pytest.mark.parametrize("policy", ["superneurons", "pooch", "vdnn-all", "recompute-cheap"])
def test_batchnorm_on_the_raw_input_whose_gradient_nobody_needs(policy: str) -> None:
    """Item 3: native_batch_norm_backward with output_mask [False, True, True] returns None
    for the input's gradient; no policy may treat it as a tensor."""
    model = mlp(nn.BatchNorm1d(20))
    ref = copy.deepcopy(model)
    x, y = data()
    with outcore.compile(model, F.cross_entropy, (x, y), budget="1TB", device="cpu-emulated",
                         policy=policy) as tr:
        torch.testing.assert_close(tr.step(x, y), eager(ref, x, y))
    assert_grads_equal(model, ref)


@pytest.mark.parametrize("policy", ["superneurons", "outcore-auto"])
def test_an_input_that_requires_grad_gets_eagers_grad(policy: str) -> None:
    """Item 5: x.grad as loss.backward() computes it (saliency, adversarial training), also
    accumulated over two steps; parameters' grads as eager's."""
    model, ref = mlp(), mlp()
    x, y = data()
    xs, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    with outcore.compile(model, F.cross_entropy, (xs, y), budget="1TB", device="cpu-emulated",
                         policy=policy) as tr:
        for _ in range(2):
            tr.step(xs, y)
            eager(ref, xr, y)
    assert xs.grad is not None
    torch.testing.assert_close(xs.grad, xr.grad)
    assert_grads_equal(model, ref)


def test_requires_grad_on_the_input_is_part_of_the_signature() -> None:
    model, ref = mlp(), mlp()
    x, y = data()
    with outcore.compile(model, F.cross_entropy, (x, y), budget=None, device="cpu") as tr:
        tr.step(x, y)
        eager(ref, x, y)
        xs, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
        tr.step(xs, y)
        eager(ref, xr, y)
        assert tr.stats.replans == 1
    torch.testing.assert_close(xs.grad, xr.grad)


def test_an_input_made_by_autograd_is_refused_before_anything_is_written() -> None:
    model = mlp()
    x, y = data()
    scale = torch.ones(20, requires_grad=True)
    with outcore.compile(model, F.cross_entropy, (x, y), budget=None, device="cpu") as tr, \
            pytest.raises(OutcoreError, match="computed by autograd"):
        tr.step(x * scale, y)
    assert all(p.grad is None for p in model.parameters()) and scale.grad is None


def test_a_smaller_last_batch_is_planned_again_and_matches_eager() -> None:
    """Item 8: 16 at compile time, 5 at the last step."""
    model, ref = mlp(), mlp()
    x, y = data()
    with outcore.compile(model, F.cross_entropy, (x, y), budget="1TB", device="cpu-emulated",
                         policy="superneurons") as tr:
        tr.step(x, y)
        eager(ref, x, y)
        torch.testing.assert_close(tr.step(x[:5], y[:5]), eager(ref, x[:5], y[:5]))
        assert tr.stats.replans == 1
        # the fixed-step trainer plans the smaller batch too (since session 21)
        fixed = PlannedTrainer(model, tr._cache[tr.signature((x, y))].planned, tr.device, None)
        torch.testing.assert_close(fixed.step(x[:5], y[:5]), eager(ref, x[:5], y[:5]))
        assert fixed.replans == 1
    assert_grads_equal(model, ref)


@pytest.mark.parametrize("policy", ["superneurons", "outcore-auto"])
def test_a_model_in_eval_mode_trains_as_eager_computes_it(policy: str) -> None:
    """Item 9: dropout off and BatchNorm running statistics used (not updated) in eval mode;
    grads as eager's, with a reminder that evaluation belongs under no_grad."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 32), nn.Dropout(0.5), nn.BatchNorm1d(32), nn.ReLU(),
                          nn.Linear(32, 4))
    model[2].running_mean.uniform_()
    model.eval()
    ref = copy.deepcopy(model)
    x, y = data()
    with outcore.compile(model, F.cross_entropy, (x, y), budget="1TB", device="cpu-emulated",
                         policy=policy) as tr, pytest.warns(EvalModeWarning, match="torch.no_grad"):
        got = tr.step(x, y)
    torch.testing.assert_close(got, eager(ref, x, y))
    assert_grads_equal(model, ref)
    assert not model.training and not model[1].training


def test_training_flags_changed_between_steps_are_captured_again() -> None:
    """Item 9: a backbone whose BatchNorm layers were frozen with .eval() (running stats
    used, not updated), then the whole model trained, then evaluated: one capture each."""
    model = FrozenBackbone()
    ref = copy.deepcopy(model)
    x, y = torch.randn(4, 3, 12, 12), torch.randint(0, 4, (4,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EvalModeWarning)
        with outcore.compile(model, F.cross_entropy, (x, y), budget="1TB",
                             device="cpu-emulated", policy="superneurons") as tr:
            for flip in (None, "train", "eval"):
                for m in (model, ref):
                    if flip is not None:
                        m.train(flip == "train")
                torch.manual_seed(3)
                got = tr.step(x, y)
                torch.testing.assert_close(got, eager(ref, x, y, seed=3))
                assert_grads_equal(model, ref)
            assert tr.stats.replans == 2


def test_under_no_grad_a_step_is_an_eager_evaluation() -> None:
    model = mlp(nn.Dropout(0.5))
    x, y = data()
    with outcore.compile(model, F.cross_entropy, (x, y), budget=None, device="cpu") as tr:
        model.eval()
        with torch.no_grad():
            loss = tr.step(x, y)
            expected = F.cross_entropy(model(x), y)
    assert torch.equal(loss, expected)
    assert all(p.grad is None for p in model.parameters())
    assert (tr.stats.eval_steps, tr.stats.steps) == (1, 0)


@pytest.mark.parametrize("kind", ["module-backward", "module-backward-pre", "global"])
def test_a_module_backward_hook_is_refused_at_compile_and_at_step(kind: str) -> None:
    """Item 9: hooks a planned step would never call are refused, naming the module (hooks
    on a parameter's gradient are called: ``tests/api/test_leaf_hooks.py``)."""
    from torch.nn.modules.module import register_module_full_backward_hook

    handles = []

    def add_hook(model: nn.Module) -> None:
        if kind == "module-backward":
            handles.append(model[0].register_full_backward_hook(lambda m, gi, go: None))
        elif kind == "module-backward-pre":
            handles.append(model[0].register_full_backward_pre_hook(lambda m, go: None))
        else:
            handles.append(register_module_full_backward_hook(lambda m, gi, go: None))

    x, y = data()
    model = mlp()
    add_hook(model)
    where = "global" if kind == "global" else "module '0'"
    try:
        with pytest.raises(UnsupportedModelError, match=where):
            outcore.compile(model, F.cross_entropy, (x, y), budget=None, device="cpu")
        handles.pop().remove()
        model = mlp()
        with outcore.compile(model, F.cross_entropy, (x, y), budget=None, device="cpu") as tr:
            add_hook(model)
            with pytest.raises(UnsupportedModelError, match="never be called"):
                tr.step(x, y)
        assert all(p.grad is None for p in model.parameters())
    finally:
        for handle in handles:
            handle.remove()


def test_a_bfloat16_model_on_a_profile_without_bfloat16_is_priced_not_refused() -> None:
    """Item 10: v100-pcie has no bfloat16 peak; it is priced at its nearest (float32)."""
    from outcore.cost.profiles import _nearest_priced

    _nearest_priced.cache_clear()
    model = mlp().to(torch.bfloat16)
    ref = copy.deepcopy(model)
    x, y = data()
    x = x.to(torch.bfloat16)

    def loss_fn(out: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out.float(), t)

    with pytest.warns(ProfileDtypeWarning, match="'v100-pcie'.*'bfloat16'"):
        tr = outcore.compile(model, loss_fn, (x, y), budget="1TB", gpu="v100-pcie",
                             device="cpu-emulated", policy="pooch")
    with tr:
        got = tr.step(x, y)
    want = loss_fn(ref(x), y)
    want.backward()
    torch.testing.assert_close(got, want.detach())
    assert_grads_equal(model, ref)


@pytest.mark.parametrize("device", ["cpu-emulated", "cpu"])
def test_an_input_gradient_under_sub_batches_is_the_whole_batchs(device: str) -> None:
    """Item 5 with a split batch (it was refused): each sub-batch's input gradient, weighted
    as its loss enters the step's, lands in its rows of ``x.grad``, equal to eager's."""
    model = conv_net()
    reference = copy.deepcopy(model)
    x, y = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))
    xs, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    budget = below_the_whole_batch(model, F.cross_entropy, (xs, y), device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = outcore.compile(model, F.cross_entropy, (xs, y), budget=budget,
                                  device=device, allow_sub_batches=True)
    assert trainer.plan.sub_batches > 1
    for _ in range(2):  # the second step accumulates, as a second backward does
        got = trainer.step(xs, y)
        want = F.cross_entropy(reference(xr), y)
        want.backward()
        torch.testing.assert_close(got, want.detach())
        assert xs.grad is not None
        torch.testing.assert_close(xs.grad, xr.grad, rtol=1e-5, atol=1e-7)
        for a, b in zip(model.parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)
    assert trainer.stats.measured_peak <= budget


class _ScalesItsBatch(nn.Module):
    """Changes its batch in place, per sample (``x.mul_(0.5)``), before a conv net."""

    def __init__(self) -> None:
        super().__init__()
        self.net = conv_net()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(0.5)
        return self.net(x)


def test_a_batch_changed_in_place_under_sub_batches_is_changed_as_eager() -> None:
    """The forward's in-place change of its batch under a split (it was refused: the new
    value is a step output that scales): each sub-batch's new rows land in the caller's
    tensor in the step's commit, as eager's forward leaves it."""
    torch.manual_seed(0)
    model = _ScalesItsBatch()
    reference = copy.deepcopy(model)
    x, y = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))
    budget = below_the_whole_batch(model, F.cross_entropy, (x.clone(), y), "cpu-emulated")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = outcore.compile(model, F.cross_entropy, (x.clone(), y), budget=budget,
                                  device="cpu-emulated", allow_sub_batches=True)
    assert trainer.plan.sub_batches > 1
    # the batch's change is no per-sub-batch buffer update: each sub-batch writes its rows
    assert "up to summation order" in trainer.stats.notes[0], trainer.stats.notes
    ours, theirs = x.clone(), x.clone()
    got = trainer.step(ours, y)
    want = F.cross_entropy(reference(theirs), y)
    want.backward()
    torch.testing.assert_close(got, want.detach())
    assert not torch.equal(theirs, x)  # eager changed it, so the comparison can fail
    assert torch.equal(ours, theirs)
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)


def test_an_input_gradient_that_cannot_fit_after_a_split_step_is_refused() -> None:
    """The whole batch's input gradient is on the device after the step, as eager's is:
    where it does not fit beside what the step holds at its end without raising the
    plan's peak (an MLP whose input is as large as its activations), ``compile`` plans
    for smaller budgets, then the whole batch, and refuses with why when none fits; a
    ``PlannedTrainer`` given a split plan refuses the step before anything runs."""
    from outcore.graph.bounds import reference_peaks

    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(5) for m in (nn.Linear(64, 64), nn.ReLU())],
                          nn.Linear(64, 4))
    x, y = torch.randn(64, 64), torch.randint(0, 4, (64,))
    graph = outcore.capture(model, F.cross_entropy, (x, y))
    peak = outcore.plan(graph, None, policy="liveness", simulate=False).predicted_peak
    low = reference_peaks(graph).layer_lower_bound
    budget = low + (peak - low) // 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        split = outcore.compile(model, F.cross_entropy, (x, y), budget=budget,
                                device="cpu-emulated", allow_sub_batches=True)
        assert split.plan.sub_batches > 1  # the premise: this budget splits the batch
        fixed = PlannedTrainer(model, split.planned, split.device, budget)
        with pytest.raises(UnsupportedModelError, match="allow_sub_batches=False"):
            fixed.step(x.clone().requires_grad_(), y)
        split.close()
        xg = x.clone().requires_grad_()
        with pytest.raises(InfeasibleBudgetError, match="sub-batches were tried") as info:
            outcore.compile(model, F.cross_entropy, (xg, y), budget=budget,
                            device="cpu-emulated", allow_sub_batches=True)
        assert info.value.required > budget and "input gradients" in str(info.value)
        with outcore.compile(model, F.cross_entropy, (xg, y), budget=info.value.required,
                             device="cpu-emulated", allow_sub_batches=True) as fits:
            assert fits.plan.sub_batches == 1  # the budget it named holds the whole batch
    assert xg.grad is None and all(p.grad is None for p in model.parameters())
