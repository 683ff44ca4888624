"""outcore-auto's portfolio skips only what cannot win: the costly searches (``LATE``) once
a plan at the compute floor is known, and, on graphs beyond ``LARGE_GRAPH`` movable
activations, every candidate but the linear-time ones; the winner's step is what running
every candidate gives."""

from __future__ import annotations

import pytest

from outcore.api import cost_model_for
from outcore.graph.bounds import reference_peaks
from outcore.policies import PolicyContext
from outcore.policies.auto import (
    CANDIDATES,
    LATE,
    LINEAR,
    compute_floor,
    greedy_policy,
    portfolio,
    run_portfolio,
)
from outcore.policies.registry import get
from outcore.sim import simulate
from outcore.sim.synthetic import residual_chain

COST = cost_model_for("v100-pcie")


def _recording(calls: list[str]):
    def runner_for(name: str):
        fn = greedy_policy if name == "outcore-auto" else get(name).fn

        def run(graph, ctx):
            calls.append(name)
            return fn(graph, ctx)
        return run
    return {n: runner_for(n) for n in CANDIDATES}


def test_late_candidates_are_skipped_once_a_plan_at_the_floor_is_known():
    graph = residual_chain(4, activation_bytes=1 << 20)
    budget = reference_peaks(graph).liveness  # keep-all fits: the greedy is at the floor
    calls: list[str] = []
    result = run_portfolio(graph, PolicyContext(budget=budget, cost=COST), CANDIDATES,
                           _recording(calls))
    assert not set(calls) & set(LATE)
    assert [e.name for e in result.entries] == list(CANDIDATES)
    for e in result.entries:
        assert (e.skipped is not None) == (e.name in LATE)
    best = result.winner
    assert best is not None and best.seconds == pytest.approx(compute_floor(graph, COST),
                                                              rel=1e-9)
    assert "skipped (a plan at the compute floor" in " ".join(result.explain())


@pytest.mark.parametrize("units,fraction", [(3, 0.8), (4, 0.6), (6, 0.5)])
def test_the_winner_is_as_fast_as_with_every_candidate_run(units, fraction):
    graph = residual_chain(units, activation_bytes=1 << 28, conv_flops=4e9)
    ctx = PolicyContext(budget=int(reference_peaks(graph).liveness * fraction), cost=COST)
    fast = run_portfolio(graph, ctx, CANDIDATES, {"outcore-auto": greedy_policy})
    full = run_portfolio(graph, ctx, CANDIDATES, {"outcore-auto": greedy_policy}, skip=False)
    assert fast.winner is not None and full.winner is not None
    assert fast.winner.seconds == pytest.approx(full.winner.seconds, rel=1e-9)
    for e in fast.entries:  # whatever ran, ran the same
        if e.fits:
            twin = next(f for f in full.entries if f.name == e.name)
            assert twin.seconds == e.seconds


def test_every_schedule_of_the_graph_is_at_least_the_compute_floor():
    graph = residual_chain(3, activation_bytes=1 << 28, conv_flops=4e9)
    budget = int(reference_peaks(graph).liveness * 0.8)
    floor = compute_floor(graph, COST)
    for name in LATE:
        out = get(name).fn(graph, PolicyContext(budget=budget, cost=COST))
        assert simulate(out.graph, out.schedule, COST).step_time >= floor * (1 - 1e-12)


def test_large_graphs_run_only_the_linear_time_candidates(monkeypatch):
    graph = residual_chain(6, activation_bytes=1 << 28, conv_flops=4e9)
    monkeypatch.setattr(portfolio, "LARGE_GRAPH", 3)
    calls: list[str] = []
    ctx = PolicyContext(budget=int(reference_peaks(graph).liveness * 0.6), cost=COST)
    result = run_portfolio(graph, ctx, CANDIDATES, _recording(calls))
    assert set(calls) <= set(LINEAR)
    assert result.winner is not None and result.winner.name in LINEAR
    skipped = [e.name for e in result.entries if e.skipped]
    assert set(skipped) == set(CANDIDATES) - set(LINEAR)


def test_large_graphs_fall_back_to_every_candidate_when_none_fits(monkeypatch):
    graph = residual_chain(4, activation_bytes=1 << 28, conv_flops=4e9)
    monkeypatch.setattr(portfolio, "LARGE_GRAPH", 3)
    monkeypatch.setattr(portfolio, "LINEAR", ("offload-all",))
    calls: list[str] = []
    ctx = PolicyContext(budget=int(reference_peaks(graph).liveness * 0.45), cost=COST)
    result = run_portfolio(graph, ctx, ("offload-all", "modnn"), _recording(calls))
    assert "modnn" in calls
    assert not any(e.skipped for e in result.entries)
