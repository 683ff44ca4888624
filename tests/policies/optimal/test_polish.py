"""``optimal.polish``: the local search on lowered plans keeps a move only when the plan
verifies, fits and simulates faster. From a plan that offloads every candidate of a hand
graph where recomputing is cheaper, it reaches a faster plan that fits (at 90% of the peak
the brute-force optimum: recompute ``u`` with its freed input kept alive), never beats that
optimum (it only returns real plans), and the planner runs it only where its search ended
far above the primal LP."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from outcore.api import cost_model_for
from outcore.graph.bounds import reference_peaks
from outcore.plan.lower import lower
from outcore.plan.memory import memory_curve
from outcore.plan.plan import Decision, Plan
from outcore.plan.verify import verify
from outcore.policies.optimal import build_problem, formulation, planner, polish
from outcore.sim import simulate

sys.path.insert(0, str(Path(__file__).parent))
from brute_force import best_time
from test_kept_alive import kept_alive

COST = cost_model_for("v100-pcie")


def _offload_all(problem) -> Plan:
    plan = Plan(policy="offload-all", budget=problem.budget)
    for c in problem.candidates:
        plan.decisions[c.tensor] = Decision.OFFLOAD
        plan.prefetch_at[c.tensor] = problem.op_order[c.first_backward]
    return plan


@pytest.mark.parametrize("fraction", [0.9, 0.8])
def test_polish_finds_a_faster_plan_that_fits(fraction):
    graph = kept_alive()
    budget = int(reference_peaks(graph).liveness * fraction)
    problem = build_problem(graph, COST, budget)
    start = _offload_all(problem)
    schedule = lower(graph, start)
    assert memory_curve(graph, schedule).peak <= budget
    step = simulate(graph, schedule, COST).step_time
    plan, out, new_step = polish.polish(graph, problem, COST, start, schedule, step)
    verify(graph, out)
    assert memory_curve(graph, out).peak <= budget
    assert simulate(graph, out, COST).step_time == pytest.approx(new_step, rel=1e-12)
    assert new_step < step * (1 - 1e-3)  # recomputing beats the slow copies here
    best = best_time(graph, COST, budget)
    assert new_step >= best * (1 - 1e-9)
    if fraction == 0.9:  # recompute u, its freed input kept alive: the brute-force optimum
        names = {graph.tensors[k].name: v.name for k, v in plan.decisions.items()}
        assert names == {"u": "RECOMPUTE"}
        assert new_step == pytest.approx(best, rel=1e-9)
    again = polish.polish(graph, problem, COST, start, schedule, step)
    assert again[0].decisions == plan.decisions and again[2] == new_step  # deterministic


def test_polish_without_a_better_move_returns_the_plan():
    graph = kept_alive()
    budget = int(reference_peaks(graph).liveness * 0.9)
    problem = build_problem(graph, COST, budget)
    start = _offload_all(problem)
    schedule = lower(graph, start)
    step = simulate(graph, schedule, COST).step_time
    plan, _, new_step = polish.polish(graph, problem, COST, start, schedule, step, max_evals=0)
    assert plan is start and new_step == step


def test_the_planner_polishes_only_far_above_the_primal_lp():
    lp = formulation.Solution(choice=[("keep",)], objective=1.0)
    near = formulation.Solution(choice=[("keep",)], objective=1.0 + planner.FAR_ABOVE_LP / 2)
    far = formulation.Solution(choice=[("keep",)], objective=1.0 + planner.FAR_ABOVE_LP * 2)
    assert not planner._far_from_lp(lp, [lp, near])
    assert not planner._far_from_lp(lp, [lp, near, far])  # the best one counts
    assert planner._far_from_lp(lp, [lp, far])
    assert not planner._far_from_lp(lp, [lp])
