"""outcore-checkpoint's keep-back: the screened search (trials rejected from a lower bound
read off the current replay) gives the same plan as lowering every trial.

Differential: on synthetic and captured zoo graphs (dropout with saved RNG states, views,
concatenations) at several budgets, ``keep_back`` with and without the screen returns the
same decisions and the same schedule, which verifies and fits; the screen's bound never
exceeds the trial's exact peak; and the screen does save lowerings.
"""

from __future__ import annotations

import copy
import random
from functools import partial

import pytest

from outcore import zoo
from outcore.api import cost_model_for
from outcore.capture import capture
from outcore.graph.ir import Graph
from outcore.plan.lower import lower
from outcore.plan.memory import memory_curve
from outcore.plan.plan import Decision, Plan
from outcore.plan.residency import RNG_STATE_BYTES
from outcore.plan.schedule import Compute
from outcore.plan.verify import verify
from outcore.plan.weights import WeightPlacement, parameters
from outcore.policies.auto import find_cuts, keep_back, peak_and_screen, segment_plan
from outcore.policies.baseline import movable_activations
from outcore.sim.synthetic import residual_chain

COST = cost_model_for("v100-pcie")


def _zoo(name: str, batch: int, **options: object) -> Graph:
    w = zoo.get(name, batch, fake=True, small=True, **options)
    return capture(w.model, w.loss_fn, w.batch, fake=True, name=name)


def _gpt_with_rng_states() -> Graph:
    graph = _zoo("transformer", 4, n_layer=3, dropout=0.1, seq_len=32)
    graph.meta[RNG_STATE_BYTES] = 1 << 16  # saved generator states, as large as activations
    return graph


GRAPHS = {
    "residual-chain": lambda: residual_chain(24),
    "resnet20": lambda: _zoo("resnet20-cifar", 8),
    "gpt-dropout": _gpt_with_rng_states,
    "densenet": lambda: _zoo("densenet-bc100-cifar", 4),
}


@pytest.fixture(scope="module", params=sorted(GRAPHS))
def graph(request: pytest.FixtureRequest) -> Graph:
    return GRAPHS[request.param]()


def _start(graph: Graph) -> tuple[Plan, int, int]:
    """Full checkpoint segments (every cut kept), its peak and the in-core peak."""
    plan = segment_plan(graph, [s for c in find_cuts(graph) for s in c.storages])
    low = memory_curve(graph, lower(graph, plan)).peak
    high = memory_curve(graph, lower(graph, Plan("in-core"))).peak
    return plan, low, high


def _counting(lowerer):
    calls = [0]

    def run(graph: Graph, plan: Plan):
        calls[0] += 1
        return lowerer(graph, plan)
    return run, calls


def _both(graph: Graph, start: Plan, budget: int, lowerer=lower):
    """keep_back screened and unscreened from copies of ``start``: (plan, schedule, lowerings)
    each."""
    out = []
    for screen in (True, False):
        plan = copy.deepcopy(start)
        count, calls = _counting(lowerer)
        plan, schedule = keep_back(graph, plan, lowerer(graph, plan), budget, COST, count,
                                   screen=screen)
        out.append((plan, schedule, calls[0]))
    return out


@pytest.mark.parametrize("share", [0.15, 0.4, 0.7, 0.9])
def test_screened_keep_back_is_the_exhaustive_one(graph: Graph, share: float):
    start, low, high = _start(graph)
    budget = low + int((high - low) * share)
    (plan, schedule, lowered), (ref, ref_schedule, ref_lowered) = _both(graph, start, budget)
    assert plan.decisions == ref.decisions and plan.reasons == ref.reasons
    assert schedule.instructions == ref_schedule.instructions
    verify(graph, schedule)
    assert memory_curve(graph, schedule).peak <= budget
    assert lowered <= ref_lowered
    kept_back = [t for t, d in start.decisions.items()
                 if d is Decision.RECOMPUTE and t not in plan.decisions]
    assert kept_back, "the budget leaves room to keep some activations back"


def test_the_screen_saves_lowerings_near_a_full_budget():
    graph = residual_chain(40)
    start, low, high = _start(graph)
    budget = low + (high - low) // 3
    (plan, _, lowered), (ref, _, ref_lowered) = _both(graph, start, budget)
    assert plan.decisions == ref.decisions
    assert lowered < ref_lowered // 2, (lowered, ref_lowered)


def test_copies_in_the_schedule_turn_the_screen_off_and_the_plan_is_the_same():
    """Parameters held in host memory put Prefetches in the schedule: every trial is
    lowered, as without the screen."""
    graph = _zoo("resnet20-cifar", 8)
    held = WeightPlacement(params=frozenset(list(parameters(graph).values())[:4]))
    lowerer = partial(lower, weights=held)
    start, low, high = _start(graph)
    budget = low + (high - low) // 2
    (plan, schedule, lowered), (ref, ref_schedule, ref_lowered) = _both(
        graph, start, budget, lowerer)
    assert plan.decisions == ref.decisions
    assert schedule.instructions == ref_schedule.instructions
    assert lowered == ref_lowered
    verify(graph, schedule)


def _computes(instructions) -> list[Compute]:
    return [ins for ins in instructions if isinstance(ins, Compute)]


def test_the_screen_bound_never_exceeds_the_trial_peak(graph: Graph):
    """Random current plans and random chunks to keep: the trial runs the current
    schedule's Computes before ``first_change``; the screen's lower bound is at most the
    exact peak of the lowered trial, and equals it often enough to reject trials."""
    start, _, _ = _start(graph)
    read_back = set(movable_activations(graph))  # what keep_back tries to keep
    recomputed = sorted(t for t, d in start.decisions.items() if d is Decision.RECOMPUTE)
    rng = random.Random(7)
    tight = 0
    checked = 0
    for _ in range(25):
        current = copy.deepcopy(start)
        for tid in rng.sample(recomputed, len(recomputed) // 3):
            del current.decisions[tid]
        schedule = lower(graph, current)
        _, screen = peak_and_screen(graph, schedule)
        assert screen is not None
        left = sorted(t for t, d in current.decisions.items()
                      if d is Decision.RECOMPUTE and t in read_back)
        for size in (1, 2, 5):
            chunk = rng.sample(left, min(size, len(left)))
            bound = screen.bound(chunk)
            if bound is None:
                continue
            trial = copy.deepcopy(current)
            for tid in chunk:
                del trial.decisions[tid]
            lowered = lower(graph, trial)
            peak = memory_curve(graph, lowered).peak
            assert bound <= peak, (chunk, bound, peak)
            j0 = screen.first_change(chunk)
            assert _computes(schedule.instructions[:j0]) == _computes(lowered.instructions)[
                :len(_computes(schedule.instructions[:j0]))]
            checked += 1
            tight += bound == peak
    assert checked >= 12 and tight >= 1, (checked, tight)
