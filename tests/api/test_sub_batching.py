"""Issue 18 point 2: splitting the batch is an explicit opt-in, announced (warnings, the
"outcore" logger) and shown in explain() and trainer.stats; without it a budget under the
layer-wise bound is refused with the bound and the way out."""

import copy
import logging
import warnings

import pytest
import torch
from split_helpers import below_the_whole_batch, conv_net
from torch import nn

import outcore
from outcore.errors import InfeasibleBudgetError, SubBatchWarning
from outcore.graph.bounds import reference_peaks


def bn_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Flatten(), nn.Linear(8 * 16 * 16, 10))


def plain_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                         nn.Flatten(), nn.Linear(8 * 16 * 16, 10))


BATCH = (torch.randn(32, 3, 16, 16), torch.randint(0, 10, (32,)))
LOSS = nn.functional.cross_entropy


def under_bound(model: nn.Module) -> int:
    graph = outcore.capture(model, LOSS, BATCH)
    return int(reference_peaks(graph).layer_lower_bound * 0.7)


def test_without_opt_in_a_budget_under_the_bound_is_refused_silently_changing_nothing():
    model = bn_net()
    budget = under_bound(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing announced: nothing was split
        with pytest.raises(InfeasibleBudgetError) as info:
            outcore.compile(model, LOSS, BATCH, budget=budget, device="cpu", policy="auto")
    text = str(info.value)
    assert "layer-wise lower bound" in text and "allow_sub_batches=True" in text
    assert info.value.required > budget
    assert int(model[1].num_batches_tracked) == 0


@pytest.mark.parametrize("how", [{"allow_sub_batches": True, "policy": "auto"},
                                 {"policy": "modnn"}])
def test_opted_in_split_is_announced_and_shown(how, caplog):
    model = bn_net()
    budget = under_bound(model)
    with caplog.at_level(logging.WARNING, logger="outcore"), \
            pytest.warns(SubBatchWarning, match="batch-coupled"):
        # cpu-emulated: the budget is under the tensor-only layer-wise bound; on "cpu" the
        # plan also holds the kernels' measured temporaries (issue 23), which sub-batches
        # do not all shrink, so this budget is out of reach there
        trainer = outcore.compile(model, LOSS, BATCH, budget=budget, device="cpu-emulated",
                                  **how)
    assert trainer.stats.sub_batches > 1
    assert any("sub-batches" in r.getMessage() for r in caplog.records if r.name == "outcore")
    assert trainer.stats.notes and "BatchNorm" in trainer.stats.notes[0]
    assert trainer.explain().notes == trainer.stats.notes
    assert "sub-batches (opted in)" in str(trainer.stats)
    trainer.step(*BATCH)
    assert int(model[1].num_batches_tracked) == trainer.stats.sub_batches


def test_without_batch_coupled_layers_the_split_matches_eager_up_to_summation_order():
    model = plain_net()
    reference = copy.deepcopy(model)
    budget = under_bound(model)
    with pytest.warns(SubBatchWarning, match="no batch-coupled layers"):
        trainer = outcore.compile(model, LOSS, BATCH, budget=budget, device="cpu-emulated",
                                  allow_sub_batches=True)  # as above
    assert trainer.stats.sub_batches > 1
    trainer.step(*BATCH)
    LOSS(reference(BATCH[0]), BATCH[1]).backward()
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)


class Counted(nn.Module):
    """No batch-coupled layer, but buffers the forward updates: a step counter and an EMA of
    the inputs that the forward reads."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = plain_net()
        self.register_buffer("steps", torch.zeros(()))
        self.register_buffer("ema", torch.zeros(3, 16, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.steps += 1
        self.ema.mul_(0.9).add_(x.detach().mean(0), alpha=0.1)
        return self.net(x - self.ema)


def test_buffers_the_forward_updates_are_said_to_differ_under_a_split():
    """A split without batch-coupled layers was announced as equal to eager up to summation
    order even when the forward updated buffers: they were updated once per sub-batch (the
    counter k times a step, the EMA from each sub-batch's mean) and the gradients through
    the EMA differed, silently."""
    model = Counted()
    reference = copy.deepcopy(model)
    with pytest.warns(SubBatchWarning, match="updates buffers steps, ema once per sub-batch"):
        trainer = outcore.compile(model, LOSS, BATCH, budget=under_bound(copy.deepcopy(model)),
                                  device="cpu-emulated", allow_sub_batches=True)
    parts = trainer.stats.sub_batches
    assert parts > 1 and "differ from eager" in trainer.stats.notes[0]
    assert "up to summation order" not in trainer.stats.notes[0]
    trainer.step(*BATCH)
    LOSS(reference(BATCH[0]), BATCH[1]).backward()
    assert int(model.steps) == parts and int(reference.steps) == 1  # what the note says
    assert not torch.allclose(model.net[0].weight.grad, reference.net[0].weight.grad)


def test_plan_hands_policies_no_recapture_without_opt_in(monkeypatch):
    from outcore.policies import registry

    seen = []
    real = registry.get

    def get(name):
        info = real(name)

        def fn(graph, ctx):
            seen.append(ctx.recapture)
            return info.fn(graph, ctx)

        return type(info)(info.name, fn, info.description, info.paper, info.config)

    import outcore.planned

    monkeypatch.setattr(outcore.planned, "get", get)
    model = bn_net()
    graph = outcore.capture(model, LOSS, BATCH)
    outcore.plan(graph, None, recapture=lambda k: graph)
    outcore.plan(graph, None, recapture=lambda k: graph, allow_sub_batches=True)
    assert seen[0] is None and seen[1] is not None


def test_invalid_arguments_fail_before_the_capture(monkeypatch):
    import outcore.trainer

    monkeypatch.setattr(outcore.trainer, "capture", lambda *a, **k: pytest.fail("captured"))
    for kwargs, error in (({"budget": "1e400"}, outcore.errors.NonFiniteBudgetError),
                          ({"budget": -1}, outcore.errors.NonPositiveBudgetError),
                          ({"budget": 0}, outcore.errors.NonPositiveBudgetError),
                          ({"budget": float("nan")}, outcore.errors.NonFiniteBudgetError),
                          ({"policy": "nope"}, outcore.errors.UnknownPolicyError),
                          ({"gpu": "h9000"}, outcore.errors.UnknownGPUError),
                          ({"device": "tpu"}, outcore.errors.UnknownDeviceError)):
        with pytest.raises(error) as info:
            outcore.compile(bn_net(), LOSS, BATCH, **{"device": "cpu", **kwargs})
        assert isinstance(info.value, ValueError)
        assert repr(next(iter(kwargs.values())))[:5] in str(info.value) \
            or str(next(iter(kwargs.values()))) in str(info.value)


def test_step_on_a_batch_unlike_the_captured_one_replans_or_refuses_cleanly():
    """A new shape (the last, smaller batch) is captured and planned again; a batch the
    model cannot run (float64 into float32 weights) is refused as a CaptureError naming
    torch's reason, before anything is applied."""
    model = plain_net()
    trainer = outcore.compile(model, LOSS, BATCH, budget=None, device="cpu")
    x, y = BATCH
    with pytest.raises(outcore.errors.CaptureError, match="double"):
        trainer.step(x.double(), y)
    assert all(p.grad is None for p in model.parameters())  # nothing ran
    trainer.step(x[:8], y[:8])
    assert trainer.stats.replans == 1
    trainer.step(x, y)
    assert trainer.stats.cache_hits >= 1


@pytest.mark.parametrize("policy", ["modnn", "auto"])
def test_on_a_real_device_the_split_counts_the_kernels_temporaries(policy):
    """On device="cpu" the plan holds each kernel's measured temporaries (a convolution's
    column buffers: 32 MiB here at the full batch). moDNN sized sub-batches without them:
    below the full batch's lowest peak it kept the full batch, whose plan then peaked
    above the budget, and the step was refused though two sub-batches fit. Now it splits,
    the plan fits, and the gradients are eager's up to summation order."""
    model = conv_net()
    reference = copy.deepcopy(model)
    x, y = torch.randn(64, 3, 64, 64), torch.randint(0, 10, (64,))
    budget = below_the_whole_batch(model, LOSS, (x, y), "cpu")
    assert budget / 0.9 > reference_peaks(outcore.capture(
        model, LOSS, (x, y))).layer_lower_bound  # the temporaries: above tensors alone
    with pytest.warns(SubBatchWarning):
        trainer = outcore.compile(model, LOSS, (x, y), budget=budget, device="cpu",
                                  policy=policy, allow_sub_batches=True)
    assert trainer.stats.sub_batches > 1
    assert trainer.stats.predicted_peak <= budget
    trainer.step(x, y)
    LOSS(reference(x), y).backward()
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        # sums over 64 x 64 x 64 positions in another order (and moDNN's kernels)
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)


class CenteredOnTheBatch(nn.Module):
    """Subtracts the batch's mean (a statistic over samples that is not BatchNorm): a
    sub-batch centres on its own mean, so the split computes something else."""

    def __init__(self) -> None:
        super().__init__()
        self.net = plain_net()

    def forward(self, x):
        return self.net(x - x.mean(0, keepdim=True))


def test_a_coupling_that_is_not_batchnorm_is_named_in_the_note():
    """The note said "no batch-coupled layers, so gradients equal the full batch's" for any
    coupling but BatchNorm's targets, though ``batch_dims.follow`` had proven the op
    couples samples; it now names every proven op and says what differs."""
    model = CenteredOnTheBatch()
    with pytest.warns(SubBatchWarning, match="batch-coupled ops") as seen:
        trainer = outcore.compile(model, LOSS, BATCH, budget=under_bound(model),
                                  device="cpu-emulated", allow_sub_batches=True)
    assert trainer.stats.sub_batches > 1
    note = trainer.stats.notes[0]
    assert "sub" in note and "differ from eager" in note, note
    assert "up to summation order" not in note and "BatchNorm" not in note, note
    assert any("batch-coupled ops" in str(w.message) for w in seen)


def test_a_split_is_planned_again_with_room_for_the_input_gradients(monkeypatch):
    """``with_room_for_input_grads``' control: a split whose end lacks room for the whole
    batch's input gradients is planned again for the budget less the shortfall, and the
    plan that leaves room is kept with a note saying so; the step unsplit only when none
    does (its refusal then says why)."""
    from types import SimpleNamespace

    from outcore.runtime import sub_batch_assembly as sba

    def planned(parts, room):
        return SimpleNamespace(plan=SimpleNamespace(sub_batches=parts, policy="p"),
                               graph=None, schedule=room, notes=[])

    monkeypatch.setattr(sba, "room_after", lambda graph, room, parts: sba.AfterStep(
        outputs_on_device=False, input_grads_fit=room >= 100, input_grad_bytes=100,
        room=room))
    asked = []

    def plan_for(target):
        asked.append(target)
        return planned(4, 100 if len(asked) == 2 else 70)

    got = sba.with_room_for_input_grads(planned(2, 60), 1000, plan_for, lambda b: None)
    assert asked == [960, 930] and got.schedule == 100  # shortfalls 40, then 30
    assert "planned for" in got.notes[0] and "input gradients" in got.notes[0]
    unsplit = planned(1, 0)
    assert sba.with_room_for_input_grads(planned(2, 60), 1000, lambda t: planned(2, 60),
                                         lambda b: unsplit) is unsplit

    def refuse(budget):
        raise InfeasibleBudgetError("p", budget, 1200, "the whole batch needs more")

    with pytest.raises(InfeasibleBudgetError, match="sub-batches were tried") as info:
        sba.with_room_for_input_grads(planned(2, 60), 1000, lambda t: planned(2, 60), refuse)
    assert info.value.required == 1200
