"""The timeline's faster ``evaluate`` (session 11: forward steps precomputed, ``earliest_fit``
inlined, residencies summed by ``bincount``, backward time stepping over event-free ops) gives
bit for bit what the code before it gave: every field of many evaluations (random
classifications at several budgets, strict or not, with and without the end-of-forward
wait) and PoocH's and Dymem's whole plans and schedules hash to the digests that code
(main b1990e8) computed on the same graphs. A change to the timeline's semantics must
recompute them (``python tests/policies/test_timeline_same_results.py`` prints them) and
say why in its commit."""

from __future__ import annotations

import dataclasses
import hashlib
import random
import sys
from pathlib import Path

import pytest

from outcore.api import cost_model_for
from outcore.capture import capture
from outcore.errors import InfeasibleBudgetError
from outcore.graph.bounds import reference_peaks
from outcore.graph.ir import Graph
from outcore.policies import PolicyContext, get
from outcore.policies.common import KEEP, RECOMPUTE, SWAP, Profile, earliest_fit, evaluate
from outcore.sim.synthetic import residual_chain

sys.path.insert(0, str(Path(__file__).parents[1] / "spine"))
from models import make

#: digests computed by main b1990e8 (the timeline before the speed-up)
EXPECTED = {
    "chain": "06626bfe586f4b7bc37b",
    "resnet": "442b1b4901f1891e8367",
    "inception": "81ce6124b133e0cafade",
    "transformer": "ee9e3dc40de627e2836e",
}

FRACTIONS = (0.35, 0.5, 0.7, 0.9)


def _graph(name: str) -> Graph:
    if name == "chain":
        return residual_chain(12)
    model, loss_fn, batch = make(name)
    return capture(model, loss_fn, batch)


def digest(graph: Graph) -> str:
    """A hash of evaluations and plans on ``graph`` (v100-pcie costs)."""
    cost = cost_model_for("v100-pcie")
    p = Profile(graph, [op.id for op in graph.ops], cost)
    peak = reference_peaks(graph).liveness
    rng = random.Random(5)
    h = hashlib.sha256()
    for fraction in FRACTIONS:
        budget = float(int(peak * fraction))
        for trial in range(24):
            cls = {x: rng.choice((KEEP, SWAP, RECOMPUTE)) for x in p.features}
            strict = trial % 3 != 2
            sync = (None, False, True)[trial % 3]
            ev = evaluate(p, cls, budget, swap_in_at=earliest_fit, strict=strict,
                          sync_forward=sync)
            h.update(repr(dataclasses.astuple(ev)).encode())
        for policy in ("pooch", "dymem"):
            try:
                out = get(policy).fn(graph, PolicyContext(budget=int(budget), cost=cost))
            except InfeasibleBudgetError as e:
                h.update(f"{policy} infeasible {e}".encode())
                continue
            decisions = sorted((t, str(d)) for t, d in out.plan.decisions.items())
            h.update(repr((decisions, sorted(out.plan.prefetch_at.items()),
                           out.schedule.instructions)).encode())
    return h.hexdigest()[:20]


@pytest.mark.parametrize("name", list(EXPECTED))
def test_same_evaluations_and_plans_as_before(name: str) -> None:
    assert digest(_graph(name)) == EXPECTED[name]


if __name__ == "__main__":
    for name in EXPECTED:
        print(f'    "{name}": "{digest(_graph(name))}",')
