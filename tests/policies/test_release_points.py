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


@pytest.mark.parametrize("fraction", [0.5, 0.9])
def test_the_simulation_handed_over_is_the_returned_schedules(fraction):
    """``greedy_policy`` hands the simulation of the schedule it returns to the portfolio
    (so it is not replayed): it must be exactly what simulating that schedule gives."""
    from outcore.policies.auto import released

    graph, budget, plan, schedule = _greedy(40, fraction)
    out = released(graph, plan, schedule, budget, COST)
    fresh = simulate(graph, out.schedule, COST)
    assert out.simulation.step_time == fresh.step_time
    assert out.simulation.end == fresh.end and out.simulation.memory == fresh.memory
    given = greedy_policy(graph, PolicyContext(budget=budget, cost=COST))
    assert given.simulation is not None
    assert given.simulation.step_time == simulate(graph, given.schedule, COST).step_time


def test_the_portfolio_does_not_replay_the_greedys_schedule(monkeypatch):
    import outcore.sim as sim_module
    from outcore.policies.auto import run_portfolio

    graph = residual_chain(20)
    budget = int(reference_peaks(graph).liveness * 0.5)
    calls: list[int] = []
    real = sim_module.simulate

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(sim_module, "simulate", counted)
    from outcore.policies.auto import portfolio

    replays: list[int] = []
    real_curve = portfolio.memory_curve
    monkeypatch.setattr(portfolio, "memory_curve",
                        lambda *a, **k: replays.append(1) or real_curve(*a, **k))
    result = run_portfolio(graph, PolicyContext(budget=budget, cost=COST), ("outcore-auto",),
                           {"outcore-auto": greedy_policy}, parallel=False)
    entry = result.entries[0]
    assert entry.fits and calls == []  # the greedy's own simulation was reused
    assert entry.output.trace is not None and replays == []  # nor its memory replayed
    assert entry.seconds == real(graph, entry.output.schedule, COST).step_time


def test_the_trace_handed_over_is_the_returned_schedules():
    from outcore.policies.auto import released

    graph, budget, plan, schedule = _greedy(40, 0.5)
    out = released(graph, plan, schedule, budget, COST)
    assert out.schedule is not schedule and out.trace is not None  # release points were set
    fresh = memory_curve(graph, out.schedule)
    assert (out.trace.peak, out.trace.device, out.trace.host) == (fresh.peak, fresh.device,
                                                                 fresh.host)
