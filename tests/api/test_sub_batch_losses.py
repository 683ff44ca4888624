"""Issue 21 point 9: under sub-batches each sub-batch's gradient is weighted as the traced loss
reduces (mean, sum, mean over non-ignored targets, class-weighted mean, label smoothing), so
loss and every ``.grad`` equal eager PyTorch's on the whole batch; a loss that cannot be split
exactly is refused, before anything is written."""

import copy
import warnings

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import outcore
from outcore.errors import InfeasibleBudgetError, SubBatchWarning
from outcore.graph.bounds import reference_peaks
from outcore.runtime.loss_split import LossSplitError

CLASSES = 5
WEIGHT = torch.tensor([1.0, 2.0, 3.0, 0.5, 0.25])


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, CLASSES))


def labels(ignored: bool) -> torch.Tensor:
    torch.manual_seed(1)
    y = torch.randint(0, CLASSES, (64,))
    if ignored:  # the sub-batches hold different counts, one holds none at all
        y[48:] = -100
        y[3] = y[20] = y[21] = -100
    return y


X = torch.randn(64, 16, generator=torch.Generator().manual_seed(2))

def _soft(t: torch.Tensor) -> torch.Tensor:
    """Class-probability targets (label smoothing by hand, as mixup / cutmix give them)."""
    return F.one_hot(t, CLASSES).float() * 0.8 + 0.2 / CLASSES


CASES = {
    "mean": (nn.CrossEntropyLoss(), False),
    "sum": (nn.CrossEntropyLoss(reduction="sum"), False),
    "ignore_index": (nn.CrossEntropyLoss(), True),
    "class_weighted": (nn.CrossEntropyLoss(weight=WEIGHT), False),
    "class_weighted_ignore_index": (nn.CrossEntropyLoss(weight=WEIGHT), True),
    "label_smoothing": (nn.CrossEntropyLoss(label_smoothing=0.1), False),
    "label_smoothing_ignore_index": (nn.CrossEntropyLoss(label_smoothing=0.1), True),
    "label_smoothing_class_weighted": (nn.CrossEntropyLoss(weight=WEIGHT, label_smoothing=0.1),
                                       True),
    "nll_sum_ignore_index": (lambda o, t: F.nll_loss(o.log_softmax(1), t, reduction="sum"), True),
    "mse_mean_scaled": (lambda o, t: 0.5 * F.mse_loss(o, o.detach() * 0 + t[:, None].float()),
                        False),
    # a sum divided by the batch size traced as a number: a mean (each sub-batch's graph
    # divides by its own size); these were refused as "scaled by numbers that change"
    "sum_over_batch_size": (lambda o, t: F.cross_entropy(o, t, reduction="sum") / o.shape[0],
                            False),
    "class_probability_targets": (lambda o, t: F.cross_entropy(o, _soft(t)), False),
    "kl_div_batchmean": (lambda o, t: F.kl_div(o.log_softmax(1), _soft(t),
                                               reduction="batchmean"), False),
    # class weights the loss closes over (a lifted constant of the graph, not a loss module's
    # buffer): the same ratio of sums as nn.CrossEntropyLoss(weight=...)
    "class_weighted_closure": (lambda o, t: F.cross_entropy(o, t, weight=WEIGHT), False),
    "class_weighted_closure_ignore_index": (lambda o, t: F.cross_entropy(o, t, weight=WEIGHT),
                                            True),
    "class_prior_closure": (lambda o, t: F.cross_entropy(o + WEIGHT.log(), t), True),
}


def budget_for(model: nn.Module, loss_fn, batch) -> int:
    graph = outcore.capture(model, loss_fn, batch)
    return int(reference_peaks(graph).layer_lower_bound * 0.9)


def assert_step_as_eager(loss: torch.Tensor, model: nn.Module, reference: nn.Module,
                         loss_fn, batch) -> None:
    """``loss`` and ``model``'s ``.grad`` equal eager's step on ``reference`` (run here)."""
    expected = loss_fn(reference(batch[0]), batch[1])
    expected.backward()
    torch.testing.assert_close(loss, expected.detach(), rtol=1e-5, atol=1e-6)
    for (n, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=n)


@pytest.mark.parametrize("name", sorted(CASES))
def test_sub_batched_loss_and_grads_equal_eager(name):
    loss_fn, ignored = CASES[name]
    batch = (X, labels(ignored))
    model = mlp()
    reference = copy.deepcopy(model)
    with pytest.warns(SubBatchWarning):
        trainer = outcore.compile(model, loss_fn, batch, budget=budget_for(model, loss_fn, batch),
                                  device="cpu", allow_sub_batches=True)
    assert trainer.stats.sub_batches >= 4  # a sub-batch with every target ignored exists
    assert_step_as_eager(trainer.step(*batch), model, reference, loss_fn, batch)


def _mixed(o: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(o, t) + 1e-3 * o.pow(2).sum()


def _per_batch_size_squared(o: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    # the size is traced as a number, but this is no mean: each sub-batch would weigh 1/k**2
    return F.cross_entropy(o, t, reduction="sum") / o.shape[0] ** 2


def _sum_times_batch_size(o: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(o, t, reduction="sum") * o.shape[0]


@pytest.mark.parametrize("loss_fn", [_mixed, lambda o, t: F.cross_entropy(o, t, reduction="none")
                                     .max(), lambda o, t: F.cross_entropy(o, t) / t.float().sum(),
                                     _per_batch_size_squared, _sum_times_batch_size])
def test_a_loss_that_cannot_be_split_is_refused_when_compiling(loss_fn):
    batch = (X, labels(False))
    model = mlp()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing announced: nothing split
        with pytest.raises(InfeasibleBudgetError, match="cannot be split into sub-batches"):
            outcore.compile(model, loss_fn, batch, budget=budget_for(model, loss_fn, batch),
                            device="cpu", policy="modnn")


def test_terms_that_disagree_on_this_batch_are_refused_before_anything_is_written():
    """A plain mean beside a mean over the non-ignored targets: equal weights without ignored
    targets (compiles and matches eager), refused on a batch that has some."""
    def loss_fn(o, t):
        return F.cross_entropy(o, t) + F.mse_loss(o, torch.zeros_like(o))

    model = mlp()
    reference = copy.deepcopy(model)
    clean = (X, labels(False))
    with pytest.warns(SubBatchWarning):
        trainer = outcore.compile(model, loss_fn, clean, budget=budget_for(model, loss_fn, clean),
                                  device="cpu", allow_sub_batches=True)
    trainer.step(*clean)
    loss_fn(reference(clean[0]), clean[1]).backward()
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)
    before = [p.grad.clone() for p in model.parameters()]
    with pytest.raises(LossSplitError, match="sub-batch"):
        trainer.step(X, labels(True))
    for p, b in zip(model.parameters(), before, strict=True):
        assert torch.equal(p.grad, b)


def test_every_recapture_weighs_a_sum_over_batch_size_as_a_mean():
    """The class of the bug: a sub-batch graph read alone takes ``sum / batch size`` for a
    plain sum (weight 1 per sub-batch: k times the gradient), so every recapture for
    sub-batches must compare with its full batch (``checked_sub_batch``). PlannedTrainer's
    re-plan of a batch of another size recaptured without it."""
    from outcore.planned_trainer import PlannedTrainer

    loss_fn = CASES["sum_over_batch_size"][0]
    model = mlp()
    reference = copy.deepcopy(model)
    batch = (X, labels(False))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SubBatchWarning)
        trainer = outcore.compile(model, loss_fn, batch, budget=budget_for(model, loss_fn, batch),
                                  device="cpu", allow_sub_batches=True)
        planned = trainer._cache[trainer.signature(batch)].planned
        assert planned.plan.sub_batches > 1
        smaller = (X[:32].clone(), labels(False)[:32].clone())
        # the whole 32 do not fit either (their layer-wise bound is above this budget)
        fixed = PlannedTrainer(model, planned, trainer.device,
                               int(budget_for(model, loss_fn, smaller) / 0.9 * 0.97))
        loss = fixed.step(*smaller)
    assert fixed.stats.sub_batches > 1  # the re-planned batch is split too
    assert_step_as_eager(loss, model, reference, loss_fn, smaller)


def test_closed_over_class_weights_changed_in_place_split_with_the_new_weights():
    """modnn with sub-batches, the loss closing over class weights that change in place
    between steps (a class-balancing schedule): each step's sub-batch weights are read from
    the weights as they are then (``sub_batch_weights`` binds the live tensor), so loss and
    gradients equal eager's on every step, ignored targets included."""
    weight = WEIGHT.clone()

    def loss_fn(o, t):
        return F.cross_entropy(o, t, weight=weight)

    model = mlp()
    reference = copy.deepcopy(model)
    batch = (X, labels(True))
    with pytest.warns(SubBatchWarning):
        trainer = outcore.compile(model, loss_fn, batch, budget=budget_for(model, loss_fn, batch),
                                  device="cpu", policy="modnn", allow_sub_batches=True)
    assert trainer.stats.sub_batches >= 4
    for step in range(3):
        if step:
            weight.copy_(weight.flip(0) * 2)  # the rarest class weighs most now
        model.zero_grad()
        reference.zero_grad()
        assert_step_as_eager(trainer.step(*batch), model, reference, loss_fn, batch)
