"""``optimal.rounding.improve``: the root MILP of the whole primal model returns integral
points of the model that lower to verified plans within the budget, only when the search
is far above the LP, and never on models beyond ``ROOT_CANDIDATES``."""

from __future__ import annotations

import pytest

from outcore.api import cost_model_for
from outcore.graph.bounds import reference_peaks
from outcore.plan.lower import lower
from outcore.plan.memory import memory_curve
from outcore.plan.verify import verify
from outcore.policies.optimal import build_problem, formulation, plan_optimal, planner, rounding
from outcore.sim import simulate
from outcore.sim.synthetic import residual_chain

GRAPH = residual_chain(6, activation_bytes=1 << 30, conv_flops=2e10)
COST = cost_model_for("v100-pcie")
PEAK = reference_peaks(GRAPH).liveness


def model_and_lp(fraction: float) -> tuple[formulation.Model, formulation.Solution]:
    model = formulation.Model(build_problem(GRAPH, COST, int(PEAK * fraction)), relaxed=False)
    return model, model.solve(integral=False)


@pytest.mark.parametrize("fraction", [0.8, 0.6])
def test_the_root_milp_gives_verified_plans_that_fit(fraction):
    model, lp = model_and_lp(fraction)
    # nothing better known: it runs
    (found,) = rounding.improve(model, lp, [lp], above_lp=planner.STOP_GAP)
    assert all(found.settled)  # an integral point of the model
    assert found.objective >= lp.objective * (1 - 1e-9)
    plan = planner._to_plan(GRAPH, model.p, found.choice, "root MILP")
    schedule = lower(GRAPH, plan)
    verify(GRAPH, schedule)
    assert memory_curve(GRAPH, schedule).peak <= model.p.budget
    # the planner simulates every try: the model's step is not the simulator's (this
    # synthetic graph at 60%: model 0.409 s, simulated 0.440 s), so only the order is checked
    assert simulate(GRAPH, schedule, COST).step_time >= planner._bound(model.p, False) * (1 - 1e-9)


def test_it_does_not_run_when_the_search_is_near_the_lp(monkeypatch):
    model, lp = model_and_lp(0.6)
    (found,) = rounding.improve(model, lp, [lp], above_lp=planner.STOP_GAP)
    calls = []
    monkeypatch.setattr(model, "solve", lambda **kw: calls.append(kw))
    near = formulation.Solution(choice=found.choice, objective=lp.objective * 1.005)
    assert rounding.improve(model, lp, [lp, near], above_lp=planner.STOP_GAP) == []
    monkeypatch.setattr(rounding, "ROOT_CANDIDATES", len(model.p.candidates) - 1)
    assert rounding.improve(model, lp, [lp], above_lp=planner.STOP_GAP) == []
    assert calls == []


def test_it_does_not_run_when_the_search_is_far_above_the_lp(monkeypatch):
    model, lp = model_and_lp(0.6)
    (found,) = rounding.improve(model, lp, [lp], above_lp=planner.STOP_GAP)
    calls = []
    monkeypatch.setattr(model, "solve",
                        lambda **kw: calls.append(kw) or formulation.Solution())
    far = formulation.Solution(choice=found.choice,
                               objective=lp.objective * (1 + rounding.FAR_ABOVE_LP) * 1.01)
    assert rounding.improve(model, lp, [lp, far], above_lp=planner.STOP_GAP) == []
    assert calls == []
    within = formulation.Solution(choice=found.choice,
                                  objective=lp.objective * (1 + rounding.FAR_ABOVE_LP) * 0.99)
    rounding.improve(model, lp, [lp, within], above_lp=planner.STOP_GAP)
    assert len(calls) == 1  # between STOP_GAP and FAR_ABOVE_LP it runs

def test_it_only_returns_a_better_plan_than_the_search():
    model, lp = model_and_lp(0.6)
    (found,) = rounding.improve(model, lp, [lp], above_lp=planner.STOP_GAP)
    known = formulation.Solution(choice=found.choice, objective=found.objective)
    # cut off at the known step
    assert rounding.improve(model, lp, [lp, known], above_lp=planner.STOP_GAP) == []


def test_the_planner_keeps_its_plans_verified_with_the_root_milp():
    budget = int(PEAK * 0.6)
    result = plan_optimal(GRAPH, budget, COST, exact_candidates=0)
    verify(GRAPH, result.schedule)
    assert memory_curve(GRAPH, result.schedule).peak <= budget
    assert result.lower_bound <= result.step_time * (1 + 1e-9)
