"""The stage bound (``optimal.stage_bound``): never above the best plan found by brute force,
never below the in-core step, and above it where the budget forces traffic or recompute."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from outcore.api import cost_model_for
from outcore.graph.bounds import reference_peaks
from outcore.policies.optimal import build_problem, lower_bound, stage_bound
from outcore.sim.synthetic import residual_chain

sys.path.insert(0, str(Path(__file__).parent))
from brute_force import best_time

GRAPH = residual_chain(2, activation_bytes=1 << 30, conv_flops=2e10)
COST = cost_model_for("v100-pcie")
PEAK = reference_peaks(GRAPH).liveness


@pytest.mark.parametrize("fraction", [0.9, 0.8])
def test_stage_bound_is_below_the_brute_force_optimum_and_above_in_core(fraction):
    problem = build_problem(GRAPH, COST, int(PEAK * fraction))
    bound = stage_bound(problem)
    best = best_time(GRAPH, COST, int(PEAK * fraction))
    assert problem.in_core_time < bound <= best * (1 + 1e-9)


def test_stage_bound_is_the_in_core_step_when_memory_fits():
    problem = build_problem(GRAPH, COST, PEAK)
    assert stage_bound(problem) == pytest.approx(problem.in_core_time, rel=1e-12)


def test_lower_bound_takes_the_larger_of_the_lp_and_the_stage_bound():
    budget = int(PEAK * 0.8)
    GRAPH.meta.pop("_outcore_optimal_bounds", None)
    found = lower_bound(GRAPH, budget, COST)
    assert found is not None
    assert found >= stage_bound(build_problem(GRAPH, COST, budget)) - 1e-15
    assert found <= best_time(GRAPH, COST, budget) * (1 + 1e-9)


def test_stage_bound_on_a_thousand_unit_chain_is_quick_and_valid():
    graph = residual_chain(1000)
    problem = build_problem(graph, COST, int(reference_peaks(graph).liveness * 0.5))
    assert len(problem.candidates) > 1000
    assert stage_bound(problem) >= problem.in_core_time * (1 - 1e-9)


def test_lower_bound_is_exactly_the_in_core_step_when_the_in_core_plan_fits():
    """Summation order must not lift the bound a few ulps above the in-core plan's
    simulated step (outcore.plan would then drop the bound as beaten)."""
    import outcore
    from outcore.policies.optimal import lower_bound

    graph = residual_chain(4, activation_bytes=1 << 28, conv_flops=2e10)  # stage bound +1 ulp
    budget = reference_peaks(graph).liveness
    found = lower_bound(graph, budget, COST)
    step = outcore.plan(graph, budget, policy="outcore-optimal", cost=COST, cache=False,
                        host_budget=None).simulation.step_time
    assert found == build_problem(graph, COST, budget).in_core_time
    assert found <= step


@pytest.mark.parametrize("fraction", [0.9, 0.8, 0.7])
def test_the_recompute_only_bound_is_below_every_recompute_only_plan(fraction):
    """``offload=False``: a bound on plans that never offload (outcore-checkpoint's), at
    least the general stage bound, never above the fastest recompute-only plan that fits."""
    from brute_force import every_plan

    from outcore.plan.plan import Decision

    budget = int(PEAK * fraction)
    problem = build_problem(GRAPH, COST, budget)
    general, only = stage_bound(problem), stage_bound(problem, offload=False)
    assert only >= general * (1 - 1e-12)
    steps = [step for plan, step in every_plan(GRAPH, COST, budget)
             if Decision.OFFLOAD not in plan.decisions.values()]
    if steps:
        assert only <= min(steps) * (1 + 1e-9)


@pytest.mark.parametrize("units,fraction", [(4, 0.9), (4, 0.8), (8, 0.7), (16, 0.6)])
def test_outcore_checkpoint_never_beats_the_recompute_only_bound(units, fraction):
    """The bound the portfolio skips outcore-checkpoint by holds for its plans (recompute
    only, lowered by outcore), and is above the general stage bound where recompute is
    the only way to free bytes."""
    from outcore.errors import InfeasibleBudgetError
    from outcore.policies import PolicyContext, get
    from outcore.sim import simulate

    graph = residual_chain(units, activation_bytes=1 << 28, conv_flops=4e9)
    budget = int(reference_peaks(graph).liveness * fraction)
    problem = build_problem(graph, COST, budget)
    only = stage_bound(problem, offload=False)
    assert only > stage_bound(problem)
    try:
        out = get("outcore-checkpoint").fn(graph, PolicyContext(budget=budget, cost=COST))
    except InfeasibleBudgetError:
        pytest.fail("the case needs a checkpoint plan that fits")
    step = simulate(graph, out.schedule, COST).step_time
    assert step >= only * (1 - 1e-9)
