"""A candidate offloaded and freed at a stage where another recompute's cascade may re-make
it (``Candidate.cascade``): the bound model must not count it resident there. Session 11's
recompute-instant row (branch s11-floor, not merged) left its offload share out and gave
0.764 s on this graph against a brute-force optimum of 0.585 s; this guards any such row."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from outcore.api import cost_model_for
from outcore.graph.bounds import reference_peaks
from outcore.graph.ir import Graph, OpCategory, Phase, TensorKind
from outcore.policies.optimal import build_problem, floor, formulation

sys.path.insert(0, str(Path(__file__).parent))
from brute_force import every_plan
from hand_graphs import HandGraph

GiB = 1 << 30
COST = cost_model_for("v100-pcie")


def offload_at_cascade() -> Graph:
    """x -> exp1 -> d (1 GiB, read in forward only) -> exp2 (heavy) -> k (1 GiB) -> exp3 -> r
    (1 GiB) -> conv -> c -> loss, and backward: a 2 GiB gradient read by ``conv_bwd`` (r's
    first backward use), then ``exp3_bwd`` reading r and k. A recompute of r re-makes k on
    the way, so ``conv_bwd`` is a stage where a cascade may re-make k; k must be freed there,
    and the best plan offloads it (re-making it is slow)."""
    h = HandGraph()
    t, op, ts = h.tensor, h.op, h.tensors
    act, fwd, bwd, grad = TensorKind.ACTIVATION, Phase.FORWARD, Phase.BACKWARD, TensorKind.GRADIENT
    ew, small = OpCategory.ELEMENTWISE, 1 << 20
    w, x = t("w", 1 << 16, TensorKind.PARAMETER), t("x", GiB // 4, TensorKind.INPUT)
    d, k, r, c = t("d", GiB, act), t("k", GiB, act), t("r", GiB, act), t("c", small, act)
    loss, g = t("loss", 4, TensorKind.OUTPUT), t("tangents_1", 4, TensorKind.TANGENT)
    gc, gs, gr = t("gc", small, grad), t("gs", 2 * GiB, grad), t("gr", small, grad)
    gk, gw = t("gk", small, grad), t("gw", 1 << 16, grad)
    op("exp1", ew, fwd, [x], [d], 2.5e8)
    op("exp2", OpCategory.CONV, fwd, [d], [k], 4e12)
    op("exp3", ew, fwd, [k], [r], 2.5e8)
    op("conv", OpCategory.CONV, fwd, [r, w], [c], 2e11)
    op("loss", OpCategory.LOSS, fwd, [c], [loss], 1e6)
    op("loss_bwd", OpCategory.LOSS, bwd, [g, c], [gc], 1e6)
    op("scale", ew, bwd, [gc], [gs], 2.5e8)
    op("conv_bwd", OpCategory.CONV, bwd, [gc, r, w, gs], [gr, gw], 4e11)
    op("exp3_bwd", ew, bwd, [gr, r, k], [gk], 2.5e8)
    ts[gw].source = "grad:w"
    return h.graph([loss, gw], "offload-at-cascade")


@pytest.mark.parametrize("fraction", [0.95, 0.0])
def test_an_offload_freed_where_a_cascade_may_run_is_not_cut_off(fraction):
    graph = offload_at_cascade()
    budget = max(floor(graph, COST), int(reference_peaks(graph).liveness * fraction))
    plans = sorted(every_plan(graph, COST, budget), key=lambda pt: pt[1])
    best_plan, best = plans[0]
    assert best < math.inf
    names = {graph.tensors[k].name: v.name for k, v in best_plan.decisions.items()}
    assert names == {"k": "OFFLOAD"}  # the case the row must leave feasible
    bound = formulation.Model(build_problem(graph, COST, budget), relaxed=True).solve(
        integral=True).bound
    assert bound <= best * (1 + 1e-9)
