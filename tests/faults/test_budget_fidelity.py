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
