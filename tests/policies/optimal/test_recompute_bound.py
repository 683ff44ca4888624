"""The bound of recompute-only plans from the bound model's LP (``recompute_only_bound``):
never above the fastest recompute-only plan found by brute force, never above what
outcore-checkpoint's plans simulate at, above the recompute-only stage bound where recompute
is priced over the whole step, and the reason the portfolio gives when it skips
outcore-checkpoint as a candidate that cannot beat the best plan so far."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from outcore.api import cost_model_for
from outcore.errors import InfeasibleBudgetError
from outcore.graph.bounds import reference_peaks
from outcore.plan.plan import Decision
from outcore.policies import PolicyContext, get
from outcore.policies.auto import CANDIDATES, greedy_policy, run_portfolio
from outcore.policies.optimal import build_problem, recompute_only_bound, stage_bound
from outcore.sim import simulate
from outcore.sim.synthetic import residual_chain

sys.path.insert(0, str(Path(__file__).parent))
from brute_force import every_plan
from test_cascade_rows import cascade
from test_leaf_residency import exp_chain

COST = cost_model_for("v100-pcie")
GRAPHS = {
    "chain-2": lambda: residual_chain(2, activation_bytes=1 << 30, conv_flops=2e10),
    "cascade": cascade,
    "exp-chain": lambda: exp_chain(middle_saved=False),
}


def _budget(graph, fraction: float) -> int:
    return int(reference_peaks(graph).liveness * fraction)


@pytest.mark.parametrize("fraction", [0.9, 0.75, 0.6])
@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_the_bound_is_below_every_recompute_only_plan(name, fraction):
    graph = GRAPHS[name]()
    budget = _budget(graph, fraction)
    problem = build_problem(graph, COST, budget)
    bound = recompute_only_bound(problem)
    assert bound >= problem.in_core_time
    steps = [step for plan, step in every_plan(graph, COST, budget)
             if Decision.OFFLOAD not in plan.decisions.values()]
    if steps:
        assert bound <= min(steps) * (1 + 1e-9)


def test_the_bound_is_the_in_core_step_when_memory_fits():
    graph = GRAPHS["chain-2"]()
    problem = build_problem(graph, COST, reference_peaks(graph).liveness)
    assert recompute_only_bound(problem) == problem.in_core_time


@pytest.mark.parametrize("units,fraction", [(4, 0.9), (4, 0.8), (8, 0.7), (16, 0.6), (16, 0.5)])
def test_outcore_checkpoint_never_beats_it(units, fraction):
    graph = residual_chain(units, activation_bytes=1 << 28, conv_flops=4e9)
    budget = _budget(graph, fraction)
    bound = recompute_only_bound(build_problem(graph, COST, budget))
    try:
        out = get("outcore-checkpoint").fn(graph, PolicyContext(budget=budget, cost=COST))
    except InfeasibleBudgetError:
        pytest.fail("the case needs a checkpoint plan that fits")
    assert simulate(graph, out.schedule, COST).step_time >= bound * (1 - 1e-9)


def test_it_is_above_the_recompute_only_stage_bound_on_a_long_chain():
    """The stage bound prices the bytes freed at one stage; the LP prices every stage's
    frees on one compute stream, so on a chain whose excess spans many stages it is higher
    (as on ResNet-152 b256 v100-pcie: 2.4266 s against 2.3113 s)."""
    graph = residual_chain(16, activation_bytes=1 << 28, conv_flops=4e9)
    problem = build_problem(graph, COST, _budget(graph, 0.5))
    assert recompute_only_bound(problem) > stage_bound(problem, offload=False) * (1 + 1e-6)


def test_the_portfolio_skips_outcore_checkpoint_that_cannot_beat_the_best_plan():
    """Where outcore-optimal's plan is at or below the bound, outcore-checkpoint is skipped
    whatever ``NEAR_BOUND`` is, with the bound named, and the winner is the one every
    candidate run gives. The case: outcore-optimal's plan more than ``NEAR_BOUND`` above
    the compute floor (so the floor does not decide) and below the bound."""
    graph = residual_chain(16, activation_bytes=1 << 28, conv_flops=4e9)
    budget = _budget(graph, 0.7)
    ctx = PolicyContext(budget=budget, cost=COST)
    runners = {"outcore-auto": greedy_policy}
    full = run_portfolio(graph, ctx, CANDIDATES, runners, skip=False)
    by_full = {e.name: e for e in full.entries}
    bound = recompute_only_bound(build_problem(graph, COST, budget))
    assert by_full["outcore-optimal"].seconds <= bound, "the case must have the plan below it"
    fast = run_portfolio(graph, ctx, CANDIDATES, runners)
    skipped = {e.name: e for e in fast.entries}["outcore-checkpoint"].skipped
    assert skipped is not None and "cannot beat it" in skipped
    assert "bound model's LP of recompute-only plans" in skipped
    assert fast.winner is not None and full.winner is not None
    assert fast.winner.seconds == full.winner.seconds
    if by_full["outcore-checkpoint"].fits:
        assert by_full["outcore-checkpoint"].seconds >= bound * (1 - 1e-9)
