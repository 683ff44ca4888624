"""``outcore.plan.lower``'s faster passes (session 12: ``free_points`` finds each residency's
last use and copy-out by bisection, ``_free_unused_remakes`` tracks only the tensors a
recompute makes, ``_hoist_prefetches`` returns at once without a Prefetch) lower every plan
to the very schedule the code before them did: random keep / offload / recompute plans (with
random prefetch points) and every seed policy's plan, on four graphs at four budgets, hash to
the digests main's ``lower`` (4297ad1, the same lower.py as e5f8e2c) computed on the
same plans. A change to lowering's
semantics must recompute them (``python tests/policies/test_lower_same_results.py`` prints
them) and say why in its commit."""

from __future__ import annotations

import hashlib
import random
import sys
from pathlib import Path

import pytest

from outcore.api import cost_model_for
from outcore.capture import capture
from outcore.errors import InfeasibleBudgetError, ScheduleError
from outcore.graph.bounds import reference_peaks
from outcore.graph.ir import Graph, Phase
from outcore.plan.lower import lower
from outcore.plan.plan import Decision, Plan
from outcore.policies import PolicyContext, get
from outcore.policies.baseline import movable_activations
from outcore.sim.synthetic import residual_chain

sys.path.insert(0, str(Path(__file__).parents[1] / "spine"))
from models import make

#: digests computed by main 4297ad1 (``lower`` before the speed-up)
EXPECTED = {
    "chain": "3659a71b9310f86aa93a",
    "resnet": "9cf087e24c1c567bf306",
    "inception": "5104d4748679642e9fd3",
    "transformer": "810941073a2ef446abfc",
}

FRACTIONS = (0.35, 0.5, 0.7, 0.9)
POLICIES = ("outcore-checkpoint", "vdnn-dyn", "superneurons", "offload-all", "outcore-optimal")


def _graph(name: str) -> Graph:
    if name == "chain":
        return residual_chain(12)
    model, loss_fn, batch = make(name)
    return capture(model, loss_fn, batch)


def _random_plan(graph: Graph, rng: random.Random, budget: int) -> Plan:
    plan = Plan(policy="random", budget=budget)
    backward = [op.id for op in graph.ops if op.phase is not Phase.FORWARD]
    for tid in movable_activations(graph):
        pick = rng.choice((Decision.KEEP, Decision.OFFLOAD, Decision.RECOMPUTE))
        if pick is Decision.KEEP:
            continue
        plan.decisions[tid] = pick
        if pick is Decision.OFFLOAD and backward and rng.random() < 0.5:
            plan.prefetch_at[tid] = rng.choice(backward)
    return plan


def digest(graph: Graph) -> str:
    """A hash of the schedules ``lower`` builds for many plans on ``graph``."""
    cost = cost_model_for("v100-pcie")
    peak = reference_peaks(graph).liveness
    rng = random.Random(12)
    h = hashlib.sha256()
    for fraction in FRACTIONS:
        budget = int(peak * fraction)
        plans = [_random_plan(graph, rng, budget) for _ in range(12)]
        for name in POLICIES:
            try:
                plans.append(get(name).fn(graph, PolicyContext(budget=budget, cost=cost)).plan)
            except InfeasibleBudgetError:
                h.update(f"{name} infeasible".encode())
        for plan in plans:
            try:
                schedule = lower(graph, plan)
            except ScheduleError as exc:
                h.update(repr(exc).encode())
                continue
            h.update(repr(schedule.instructions).encode())
            h.update(repr(schedule.keep_at_end).encode())
    return h.hexdigest()[:20]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_lowering_is_bit_identical_to_the_code_before_the_speed_up(name):
    assert digest(_graph(name)) == EXPECTED[name]


if __name__ == "__main__":
    for name in sorted(EXPECTED):
        print(f'    "{name}": "{digest(_graph(name))}",')
