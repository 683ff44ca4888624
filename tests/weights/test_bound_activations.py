"""The joint bound's per-op memory term: an op's inputs and outputs sit beside the
device-held weights and state, so a batch whose largest op leaves too little room forces
held parameters even where the weights alone fit. Checked against every placement of a
tiny MLP planned at budgets where that term bites, with the optimizer after the pass and
overlapped with backward."""

import itertools

import pytest
from weights_helpers import mlp_case

from outcore.errors import InfeasibleBudgetError
from outcore.graph.ir import Phase
from outcore.sim import simulate
from outcore.weights.bound import (
    Overlap,
    joint_lower_bound,
    op_needs,
    op_times,
    param_facts,
)
from outcore.weights.choose import choose_weights
from outcore.weights.spec import optimizer_seconds
from outcore.weights.step_cost import device_adam_rate

RATE = 2e7  # a slow host optimizer: holding has a price


@pytest.fixture(scope="module")
def wide():
    """Activations (batch 512 x 256) larger than the gradients: the per-op term bites."""
    return mlp_case(512)


def _bounds(graph, cost, state, budget):
    dr = device_adam_rate(cost.profile)
    times = op_times(graph, cost)
    forward = sum(t for op, t in zip(graph.ops, times, strict=True)
                  if op.phase is Phase.FORWARD)
    add = joint_lower_bound(graph, budget, cost, state, step_cost=lambda h, d:
                            optimizer_seconds(int(h), int(d), host_rate=RATE, device_rate=dr))
    over = joint_lower_bound(graph, budget, cost, state, overlap=Overlap(RATE, dr, forward))
    return add, over


@pytest.mark.parametrize("fraction", [1.5, 1.8])
def test_the_op_term_bites_where_the_weights_fit(wide, fraction):
    """Budgets above every weight, gradient and state (the end-of-step term holds nothing)
    but below them beside the largest op: the bound prices held parameters."""
    graph, cost, state = wide
    facts = param_facts(graph, state, cost)
    total = sum(f.freed for f in facts)
    largest = max(a for a, _ in op_needs(graph, facts))
    resident = sum(f.weight + f.state for f in facts)
    budget = int(total * fraction)
    assert total < budget < resident + largest
    add, over = _bounds(graph, cost, state, budget)
    assert add is not None and add.need == 0
    assert add.optimizer > optimizer_seconds(0, sum(f.numel for f in facts),
                                             host_rate=RATE,
                                             device_rate=device_adam_rate(cost.profile))
    assert add.copies > 0  # some parameter must be held and copied
    assert over is not None and over.copies == add.copies > 0


@pytest.mark.parametrize("fraction", [1.5, 1.8, 2.2])
def test_the_bound_is_below_every_placement_where_the_op_term_bites(wide, fraction):
    graph, cost, state = wide
    facts = param_facts(graph, state, cost)
    budget = int(sum(f.freed for f in facts) * fraction)
    add, over = _bounds(graph, cost, state, budget)
    sim = lambda g, s: simulate(g, s, cost).step_time  # noqa: E731
    additive, overlapped = [], []
    for k in range(len(facts) + 1):
        for held in itertools.combinations([f.name for f in facts], k):
            try:
                a = choose_weights(graph, budget, cost, state, simulate=sim,
                                   host_adam_rate=RATE, given=held)
                o = choose_weights(graph, budget, cost, state, host_adam_rate=RATE,
                                   given=held, overlap=True)
            except InfeasibleBudgetError:
                continue
            additive.append(a.total_seconds)
            overlapped.append(o.total_seconds)
    assert additive, "some placement fits at this budget"
    assert add is not None and over is not None, "a placement fits: the bound must exist"
    assert add.seconds <= min(additive) * (1 + 1e-12)
    assert over.seconds <= min(overlapped) * (1 + 1e-12)
