"""Release points for the greedy planner's offloads (``policies.auto.release``): where a
copy-out stalls the forward, the Wait moves to where the copy has ended; the plan keeps its
decisions, fits its budget, verifies, and is faster, or it is returned unchanged."""

from __future__ import annotations

import pytest

from outcore.api import cost_model_for
from outcore.graph.bounds import reference_peaks
from outcore.plan.lower import lower
from outcore.plan.memory import memory_curve
from outcore.plan.verify import verify
from outcore.policies.auto import delay_releases, greedy_policy, plan_auto, release
from outcore.policies.registry import PolicyContext
from outcore.sim import simulate
from outcore.sim.synthetic import residual_chain

COST = cost_model_for("v100-pcie")


def _greedy(units: int, fraction: float):
    graph = residual_chain(units)
    budget = int(reference_peaks(graph).liveness * fraction)
    plan, schedule = plan_auto(graph, budget, COST)
    return graph, budget, plan, schedule


def test_stalled_copy_outs_are_waited_for_where_they_have_ended():
    graph, budget, plan, schedule = _greedy(40, 0.5)
    before = simulate(graph, schedule, COST)
    assert before.stall_time > 0  # the greedy's offloads stall the forward here
    decisions, prefetches = dict(plan.decisions), dict(plan.prefetch_at)
    moved, lowered = delay_releases(graph, plan, schedule, budget, COST)
    after = simulate(graph, lowered, COST)
    assert moved.release_at and not plan.release_at  # the input plan is not mutated
    assert (moved.decisions, moved.prefetch_at) == (decisions, prefetches)
    assert after.step_time < before.step_time
    assert after.stall_time < before.stall_time
    assert memory_curve(graph, lowered).peak <= budget
    verify(graph, lowered)
    assert lowered.instructions == lower(graph, moved).instructions
    assert all("release point" in moved.reasons[t] for t in moved.release_at)


@pytest.mark.parametrize("units", [8, 20, 40])
@pytest.mark.parametrize("fraction", [0.5, 0.6, 0.75, 0.9])
def test_the_result_always_fits_verifies_and_is_never_slower(units, fraction):
    graph, budget, plan, schedule = _greedy(units, fraction)
    moved, lowered = delay_releases(graph, plan, schedule, budget, COST)
    assert moved.decisions == plan.decisions
    assert memory_curve(graph, lowered).peak <= budget
    verify(graph, lowered)
    assert simulate(graph, lowered, COST).step_time <= simulate(graph, schedule, COST).step_time
    if moved is plan:
        assert lowered is schedule


def test_moves_that_hold_memory_over_the_budget_are_dropped(monkeypatch):
    """At a budget equal to the greedy plan's own peak no held byte is free where the peak
    is; what is left fits (or nothing moves)."""
    graph, _, plan, schedule = _greedy(40, 0.5)
    tight = memory_curve(graph, schedule).peak
    _, lowered = delay_releases(graph, plan, schedule, tight, COST)
    assert memory_curve(graph, lowered).peak <= tight
    monkeypatch.setattr(release, "BACKOFF_ROUNDS", 0)  # no lowering allowed: unchanged
    same, kept = delay_releases(graph, plan, schedule, tight, COST)
    assert same is plan and kept is schedule


def test_the_portfolio_candidate_carries_the_release_points():
    graph, budget, _, schedule = _greedy(40, 0.5)
    out = greedy_policy(graph, PolicyContext(budget=budget, cost=COST))
    assert out.plan.release_at
    assert simulate(graph, out.schedule, COST).step_time < simulate(graph, schedule,
                                                                    COST).step_time
