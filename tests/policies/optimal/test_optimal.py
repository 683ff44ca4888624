"""outcore-optimal on small graphs: the exact model finds the brute-force optimum, the bound
never exceeds it, and every plan verifies and fits its budget."""

import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from outcore.api import cost_model_for
from outcore.errors import InfeasibleBudgetError
from outcore.graph.bounds import reference_peaks
from outcore.plan.memory import memory_curve
from outcore.plan.plan import Decision
from outcore.plan.schedule import Compute
from outcore.plan.verify import verify
from outcore.policies.optimal import build_problem, plan_optimal
from outcore.sim.synthetic import residual_chain

sys.path.insert(0, str(Path(__file__).parent))
from brute_force import best_time

GRAPH = residual_chain(2, activation_bytes=1 << 30, conv_flops=2e10)
COST = cost_model_for("v100-pcie")
PEAK = reference_peaks(GRAPH).liveness


def test_exact_model_finds_the_brute_force_optimum():
    budget = int(PEAK * 0.9)
    result = plan_optimal(GRAPH, budget, COST)
    best = best_time(GRAPH, COST, budget)
    assert result.exact
    assert result.step_time == pytest.approx(best, rel=1e-9)
    assert result.lower_bound <= best * (1 + 1e-9)


@pytest.mark.parametrize("fraction", [0.9, 0.8])
def test_the_bound_never_exceeds_the_best_plan(fraction):
    budget = int(PEAK * fraction)
    result = plan_optimal(GRAPH, budget, COST)
    best = best_time(GRAPH, COST, budget)
    assert result.lower_bound <= best * (1 + 1e-9) <= result.step_time * (1 + 1e-9)
    assert result.gap == pytest.approx(result.step_time / result.lower_bound - 1)


def test_an_infeasible_budget_names_the_lowest_peak():
    with pytest.raises(InfeasibleBudgetError) as info:
        plan_optimal(GRAPH, int(PEAK * 0.5), COST)
    assert info.value.required > int(PEAK * 0.5)


@settings(max_examples=12, deadline=None)
@given(units=st.integers(2, 6), fraction=st.floats(0.55, 1.0),
       gpu=st.sampled_from(["v100-pcie", "v100-nvlink", "a100"]),
       exact_candidates=st.sampled_from([80, 0]))
def test_every_plan_verifies_and_fits(units, fraction, gpu, exact_candidates):
    """Both paths: the exact MILP, and (``exact_candidates=0``) the LP relaxation with its
    rounding and local search."""
    graph = residual_chain(units, activation_bytes=1 << 28, conv_flops=4e9)
    cost = cost_model_for(gpu)
    budget = int(reference_peaks(graph).liveness * fraction)
    try:
        result = plan_optimal(graph, budget, cost, exact_candidates=exact_candidates)
    except InfeasibleBudgetError as exc:
        assert exc.required > budget
        return
    verify(graph, result.schedule)
    assert memory_curve(graph, result.schedule).peak <= budget
    assert result.lower_bound <= result.step_time * (1 + 1e-9)


def test_chains_are_planned_and_marked():
    """A recompute whose producer reads a freed forward intermediate (the norm output under
    the residual add) re-makes it: the plan marks it RECOMPUTE too, and the schedule runs
    its producer again."""
    budget = int(PEAK * 0.8)
    result = plan_optimal(GRAPH, budget, COST)
    problem = build_problem(GRAPH, COST, budget)
    chained = {u for c in problem.candidates
               if result.plan.decision(c.tensor) is Decision.RECOMPUTE for u in c.chain}
    assert chained, "the optimum at 80% recomputes through a chain"
    assert all(result.plan.decision(u) is Decision.RECOMPUTE for u in chained)
    rerun = {i.op for i in result.schedule.instructions if isinstance(i, Compute) and i.recompute}
    assert {GRAPH.tensors[u].producer for u in chained} <= rerun


def test_outcore_optimal_leads_outcore_autos_portfolio():
    from outcore.policies.auto import CANDIDATES

    assert CANDIDATES[0] == "outcore-optimal"


def test_a_release_point_is_found_when_the_copy_out_is_long():
    """Heavy convolutions and a copy-out longer than the next op: the optimum waits for the
    copy (and frees) a few ops later instead of right after the last forward use; the exact
    model finds the brute-force optimum over release points too, the bound stays below it,
    and the same plan without its release point is slower."""
    import dataclasses

    from outcore.plan.lower import lower
    from outcore.sim import simulate

    graph = residual_chain(2, activation_bytes=1 << 28, conv_flops=3e11)
    budget = int(reference_peaks(graph).liveness * 0.9)
    result = plan_optimal(graph, budget, COST)
    assert result.exact and result.plan.release_at
    assert result.step_time == pytest.approx(best_time(graph, COST, budget), rel=1e-9)
    assert result.lower_bound <= result.step_time * (1 + 1e-9)
    verify(graph, result.schedule)
    assert memory_curve(graph, result.schedule).peak <= budget
    early = dataclasses.replace(result.plan, release_at={})
    assert simulate(graph, lower(graph, early), COST).step_time > result.step_time


def test_release_points_are_lowered_before_their_op_and_checked():
    from outcore.errors import ScheduleError
    from outcore.plan.lower import lower
    from outcore.plan.plan import Plan
    from outcore.plan.schedule import Free, Wait

    tid = next(c.tensor for c in build_problem(GRAPH, COST, PEAK).candidates)
    forward = [op.id for op in GRAPH.ops if op.phase.name == "FORWARD"]
    at = forward[-2]
    plan = Plan(policy="t", decisions={tid: Decision.OFFLOAD}, release_at={tid: at})
    ins = lower(GRAPH, plan).instructions
    k = ins.index(Compute(at))
    assert ins[k - 2:k] == [Wait(tid, "d2h"), Free(tid)]
    backward = next(op.id for op in GRAPH.ops if op.id not in forward)
    for bad in (Plan(policy="t", release_at={tid: at}),
                Plan(policy="t", decisions={tid: Decision.OFFLOAD}, release_at={tid: backward})):
        with pytest.raises(ScheduleError, match="release"):
            lower(GRAPH, bad)
