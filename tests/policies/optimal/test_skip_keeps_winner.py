"""outcore-auto's skip rules (the compute floor, the near-bound skip of outcore-checkpoint by
the bounds of recompute-only plans, outcore-optimal's seeds read after its first
segment pass) never drop the winner on the hand graphs of the exact-model tests and the
stage-bound chain: with skipping, the portfolio's winner simulates exactly as fast as with
every candidate run, and every candidate skipped near a bound simulates at or above it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from outcore.api import cost_model_for
from outcore.graph.bounds import reference_peaks
from outcore.graph.ir import Graph
from outcore.policies import PolicyContext
from outcore.policies.auto import CANDIDATES, greedy_policy, run_portfolio
from outcore.policies.optimal import build_problem, recompute_only_bound, stage_bound
from outcore.sim.synthetic import residual_chain

sys.path.insert(0, str(Path(__file__).parent))
from test_leaf_residency import exp_chain
from test_op_runs import norm_graph

COST = cost_model_for("v100-pcie")
RUNNERS = {"outcore-auto": greedy_policy}
GRAPHS = {
    "exp-chain": lambda: exp_chain(middle_saved=False),
    "exp-chain-saved": lambda: exp_chain(middle_saved=True),
    "norm": norm_graph,
    "chain-2": lambda: residual_chain(2, activation_bytes=1 << 30, conv_flops=2e10),
    "chain-4": lambda: residual_chain(4, activation_bytes=1 << 28, conv_flops=4e9),
}


def _graph(name: str) -> Graph:
    return GRAPHS[name]()


@pytest.mark.parametrize("fraction", [0.9, 0.75, 0.6])
@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_skipping_never_drops_the_winner(name, fraction):
    graph = _graph(name)
    budget = int(reference_peaks(graph).liveness * fraction)
    ctx = PolicyContext(budget=budget, cost=COST)
    full = run_portfolio(graph, ctx, CANDIDATES, RUNNERS, skip=False)
    fast = run_portfolio(graph, ctx, CANDIDATES, RUNNERS)
    if full.winner is None:
        assert fast.winner is None
        return
    assert fast.winner is not None
    assert fast.winner.seconds == full.winner.seconds
    twins = {e.name: e for e in full.entries}
    problem = build_problem(graph, COST, budget)
    only = max(stage_bound(problem, offload=False), recompute_only_bound(problem))
    for entry in fast.entries:
        if entry.skipped and "recompute-only" in entry.skipped and twins[entry.name].fits:
            assert twins[entry.name].seconds >= only * (1 - 1e-9)
