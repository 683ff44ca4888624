"""Budget fidelity on a small model (issue 19, point 4; ``benchmarks/budget_fidelity.py``
runs 20 budgets on 6 zoo models): lowering the budget never raises any policy's planned
peak nor makes a refused budget accepted, and outcore-auto's step measured on a device whose
capacity is the budget never exceeds it and equals the plan."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import outcore
from outcore.capture import capture

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
sys.path.insert(0, str(Path(__file__).parents[1] / "spine"))
from budget_fidelity import SKIP, curve, monotone_violations

from models import make


def test_violations_are_found():
    """The checker itself: a falling peak and an accepted-then-refused budget."""
    assert len(monotone_violations([1, 2, 3], [5, 4, None], "p")) == 2
    assert monotone_violations([1, 2, 3], [None, 4, 4], "p") == []


@pytest.mark.parametrize("name", ["resnet", "inception"])
def test_planned_peak_is_monotone_and_measured_within_budget(name):
    model, loss_fn, batch = make(name)
    graph = capture(model, loss_fn, batch)
    graph.meta["_batch"] = batch
    policies = [p for p in outcore.policies() if p not in SKIP]
    c = curve(name, graph, 6, policies)
    assert len(c.rows) == 6 and c.lowest < c.in_core
    assert c.violations == []
    assert all(measured <= budget for budget, _, measured in c.rows)


def test_the_ladder_makes_a_non_monotone_planner_monotone():
    """``outcore-auto`` with ``monotone=True`` (``policies.auto_ladder``): a planner that
    returns a higher peak at a budget than at a larger one, laddered, never does."""
    from outcore.errors import InfeasibleBudgetError
    from outcore.plan.memory import memory_curve
    from outcore.plan.plan import Plan
    from outcore.policies.auto_ladder import monotone_plan
    from outcore.policies.registry import PolicyContext, PolicyOutput
    from outcore.sim.synthetic import keep_all_schedule, offload_all_schedule, residual_chain

    graph = residual_chain(3, activation_bytes=1000, param_bytes=10)
    keep, off = keep_all_schedule(graph), offload_all_schedule(graph)
    high, low = memory_curve(graph, keep).peak, memory_curve(graph, off).peak
    assert low < high
    calls = []

    def planner(g, ctx):  # high at [high, high + 100), low elsewhere from `low` up
        calls.append(ctx.budget)
        b = ctx.budget
        if b is not None and b < low:
            raise InfeasibleBudgetError("fake", b, low)
        chosen = keep if b is None or high <= b < high + 100 else off
        return PolicyOutput(Plan("fake"), chosen, g)

    budgets = [low, (low + high) // 2, high, high + 50, high + 100, high + 1000]
    raw = [memory_curve(graph, planner(graph, PolicyContext(budget=b)).schedule).peak
           for b in budgets]
    assert monotone_violations(budgets, raw, "raw")  # the planner is not monotone
    laddered = [memory_curve(graph, monotone_plan(graph, PolicyContext(budget=b),
                                                  planner).schedule).peak for b in budgets]
    assert monotone_violations(budgets, laddered, "laddered") == []
    assert all(p <= b for p, b in zip(laddered, budgets, strict=True))
    with pytest.raises(InfeasibleBudgetError):
        monotone_plan(graph, PolicyContext(budget=low - 1), planner)
    calls.clear()
    monotone_plan(graph, PolicyContext(budget=low), planner)
    assert calls == []  # the rungs are cached on the graph


def test_auto_monotone_option_on_a_real_graph():
    model, loss_fn, batch = make("inception")
    graph = capture(model, loss_fn, batch)
    top = outcore.plan(graph, None, simulate=False).predicted_peak
    budgets = [top * k // 10 for k in range(5, 11)]
    peaks = []
    for b in budgets:
        try:
            peaks.append(outcore.plan(graph, b, simulate=False, monotone=True).predicted_peak)
        except outcore.errors.InfeasibleBudgetError:
            peaks.append(None)
    assert any(p is not None for p in peaks)
    assert monotone_violations(budgets, peaks, "outcore-auto monotone") == []
