"""The user's API: compile/step/plan/explain/stats, budgets, policies, errors."""

import copy
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "spine"))
import outcore
from outcore.api import PlannedStep
from outcore.graph.bounds import reference_peaks
from outcore.plan.memory import predicted_peak
from outcore.plan.plan import Decision

from models import make


def test_compile_trains_within_budget_with_eager_gradients():
    model, loss_fn, batch = make("resnet")
    reference = copy.deepcopy(model)
    graph = outcore.capture(copy.deepcopy(model), loss_fn, batch)
    peaks = reference_peaks(graph)
    budget = int(peaks.liveness * 0.6)
    trainer = outcore.compile(model, loss_fn, batch, budget=budget, device="cpu-emulated",
                              policy="auto")
    try:
        torch.manual_seed(0)
        loss = trainer.step(*batch)
    finally:
        trainer.close()
    torch.manual_seed(0)
    expected = loss_fn(reference(batch[0]), batch[1])
    expected.backward()
    assert torch.equal(loss, expected.detach())
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)
    assert trainer.stats.measured_peak == trainer.stats.predicted_peak <= budget
    moved = [d for d in trainer.plan.decisions.values() if d is not Decision.KEEP]
    assert moved, "a budget below the in-core peak must move something"
    rows = trainer.explain()
    assert {"tensor", "bytes", "decision", "why"} <= set(rows[0])
    assert any(r["decision"] != "keep" and r["why"] for r in rows)


@pytest.mark.parametrize("budget", ["1GB", "11.5GiB", 10**9, "512MB"])
def test_budget_forms_are_accepted(budget):
    model, loss_fn, batch = make("mlp")
    planned = outcore.api.plan(outcore.capture(model, loss_fn, batch), budget, policy="liveness")
    assert isinstance(planned, PlannedStep)
    assert planned.budget == outcore.parse_bytes(budget)


def test_every_listed_policy_is_accepted():
    model, loss_fn, batch = make("vgg")
    graph = outcore.capture(model, loss_fn, batch)
    listed = outcore.policies()
    assert {"keep-all", "liveness", "offload-all", "recompute-cheap", "outcore-auto"} <= set(listed)
    for name in listed:
        planned = outcore.api.plan(graph, None, policy=name)
        assert planned.predicted_peak == predicted_peak(planned.graph, planned.schedule), name
        bound = reference_peaks(planned.graph).layer_lower_bound
        assert planned.predicted_peak >= bound > 0, name
        sim = planned.simulation
        assert sim.step_time >= sim.compute_time > 0, name
        assert planned.plan.policy.startswith(name), name


def test_budget_below_lower_bound_names_the_bound():
    model, loss_fn, batch = make("vgg")
    graph = outcore.capture(model, loss_fn, batch)
    bound = reference_peaks(graph).layer_lower_bound
    with pytest.raises(outcore.InfeasibleBudgetError) as err:
        outcore.api.plan(graph, bound - 1)
    assert err.value.required == bound
    assert "lower bound" in str(err.value)


def test_policy_that_ignores_budget_is_refused_when_over():
    model, loss_fn, batch = make("vgg")
    graph = outcore.capture(model, loss_fn, batch)
    liveness = reference_peaks(graph).liveness
    with pytest.raises(outcore.InfeasibleBudgetError, match="liveness"):
        outcore.api.plan(graph, liveness - 1, policy="liveness")


def test_bad_names_are_refused():
    model, loss_fn, batch = make("mlp")
    graph = outcore.capture(model, loss_fn, batch)
    with pytest.raises(ValueError, match="unknown policy"):
        outcore.api.plan(graph, None, policy="nope")
    with pytest.raises(ValueError, match="cannot read"):
        outcore.api.plan(graph, "lots")
