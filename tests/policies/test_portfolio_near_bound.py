"""outcore-auto's portfolio skips outcore-checkpoint (``NEAR_SKIP``) once the best plan so
far is within ``NEAR_BOUND`` of a proven lower bound on its plans: the compute floor, and
the stage bound for planners whose schedules are ``outcore.plan.lower``'s (``LOWERED``).
outcore-optimal runs first of ``LATE``; PoocH is never skipped so; the skip says how much
the skipped candidate could have gained at most."""

from __future__ import annotations

import pytest

from outcore.api import cost_model_for
from outcore.graph.bounds import reference_peaks
from outcore.policies import PolicyContext
from outcore.policies.auto import (
    CANDIDATES,
    LATE,
    compute_floor,
    greedy_policy,
    portfolio,
    run_portfolio,
)
from outcore.policies.optimal import build_problem, stage_bound
from outcore.sim.synthetic import residual_chain

COST = cost_model_for("v100-pcie")
GRAPH = residual_chain(4, activation_bytes=1 << 28, conv_flops=4e9)
RUNNERS = {"outcore-auto": greedy_policy}


def _ctx(fraction: float) -> PolicyContext:
    return PolicyContext(budget=int(reference_peaks(GRAPH).liveness * fraction), cost=COST)


def _best_before(result, names) -> float:
    return min(e.seconds for e in result.entries if e.fits and e.name not in names)


def test_outcore_optimal_runs_first_of_the_late_candidates():
    late = [n for n in CANDIDATES if n in LATE]
    assert late[0] == "outcore-optimal"


def test_a_loose_tolerance_skips_outcore_checkpoint_after_outcore_optimal(monkeypatch):
    monkeypatch.setattr(portfolio, "NEAR_BOUND", 10.0)
    result = run_portfolio(GRAPH, _ctx(0.6), CANDIDATES, RUNNERS)
    by = {e.name: e for e in result.entries}
    assert by["outcore-optimal"].fits
    skipped = by["outcore-checkpoint"].skipped
    assert skipped is not None and "could gain at most" in skipped
    assert by["pooch"].skipped is None, "PoocH's own schedules: no bound but the floor"
    assert "within 1000% of the compute floor" in " ".join(result.explain())


def test_no_tolerance_skips_nothing_and_keeps_the_winner(monkeypatch):
    monkeypatch.setattr(portfolio, "NEAR_BOUND", 0.0)
    fast = run_portfolio(GRAPH, _ctx(0.6), CANDIDATES, RUNNERS)
    full = run_portfolio(GRAPH, _ctx(0.6), CANDIDATES, RUNNERS, skip=False)
    assert not any(e.skipped for e in fast.entries)
    assert fast.winner is not None and full.winner is not None
    assert fast.winner.seconds == full.winner.seconds


@pytest.mark.parametrize("fraction", [0.6, 0.45])
def test_the_stage_bound_skips_only_lowered_planners(monkeypatch, fraction):
    ctx = _ctx(fraction)
    full = run_portfolio(GRAPH, ctx, CANDIDATES, RUNNERS, skip=False)
    floor = compute_floor(GRAPH, COST)
    stage = stage_bound(build_problem(GRAPH, COST, int(ctx.budget)))
    best = _best_before(full, ("outcore-checkpoint", "pooch"))
    assert stage > floor, "the case must separate the two bounds"
    if best <= stage:
        pytest.fail("outcore-optimal's plan cannot beat the stage bound")
    # a tolerance the stage bound meets and the compute floor does not
    tol = ((best / stage - 1) + (best / floor - 1)) / 2
    monkeypatch.setattr(portfolio, "NEAR_BOUND", tol)
    result = run_portfolio(GRAPH, ctx, CANDIDATES, RUNNERS)
    by = {e.name: e for e in result.entries}
    assert by["outcore-checkpoint"].skipped is not None
    assert "plans lowered by outcore" in by["outcore-checkpoint"].skipped
    assert by["pooch"].skipped is None
    # honest: what was skipped could not have gained more than the tolerance
    twin = {e.name: e for e in full.entries}["outcore-checkpoint"]
    if twin.fits:
        assert twin.seconds >= stage * (1 - 1e-9)
        assert result.winner.seconds <= twin.seconds * (1 + tol)


def test_outcore_checkpoint_is_bounded_by_the_recompute_only_stage_bound(monkeypatch):
    """outcore-checkpoint never offloads (``RECOMPUTE_ONLY``), so the bound it is skipped by
    is the stage bound of recompute-only plans, above the general one: a tolerance between
    the two skips it only through that bound, and it could not have gained more."""
    ctx = _ctx(0.6)
    problem = build_problem(GRAPH, COST, int(ctx.budget))
    general, only = stage_bound(problem), stage_bound(problem, offload=False)
    assert "outcore-checkpoint" in portfolio.RECOMPUTE_ONLY
    assert only > general, "the case must separate the two bounds"
    full = run_portfolio(GRAPH, ctx, CANDIDATES, RUNNERS, skip=False)
    best = _best_before(full, ("outcore-checkpoint", "pooch"))
    assert best > only, "outcore-optimal's plan cannot beat the bound"
    tol = ((best / only - 1) + (best / general - 1)) / 2  # met by ``only``, not ``general``
    monkeypatch.setattr(portfolio, "NEAR_BOUND", tol)
    result = run_portfolio(GRAPH, ctx, CANDIDATES, RUNNERS)
    skipped = {e.name: e for e in result.entries}["outcore-checkpoint"].skipped
    assert skipped is not None and "recompute-only" in skipped
    twin = {e.name: e for e in full.entries}["outcore-checkpoint"]
    if twin.fits:
        assert twin.seconds >= only * (1 - 1e-9)
        assert result.winner.seconds <= twin.seconds * (1 + tol)
