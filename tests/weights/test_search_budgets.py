"""The weights search across budgets: a larger budget never gives a slower plan, the
shortest fitting prefix is found when the planners lack only a little (a prefix overshoots
its byte target), and the host optimizer is priced from the profile."""

import dataclasses
import itertools

import pytest
from weights_helpers import every_placement, make_gpt, mlp_case, token_loss

import outcore
from outcore.api import cost_model_for
from outcore.cost.model import AnalyticCostModel
from outcore.errors import InfeasibleBudgetError
from outcore.policies.auto import plan_checkpoint
from outcore.sim import simulate
from outcore.weights import search
from outcore.weights.bound import param_facts
from outcore.weights.choose import TIE, choose_weights
from outcore.weights.spec import HOST_ADAM_RATE, graph_state_bytes
from outcore.weights.step_cost import step_seconds


@pytest.fixture(scope="module")
def gpt():
    model, batch = make_gpt(n_layer=3, d_model=48, vocab=96, seq=32, batch=4)
    graph = outcore.capture(model, token_loss, batch)
    cost = cost_model_for("a100-40gb", graph)
    return graph, cost, graph_state_bytes(graph, "adamw")


def _sim(cost):
    return lambda g, s: simulate(g, s, cost).step_time


@pytest.mark.parametrize("overlap", [False, True])
def test_a_larger_budget_never_gives_a_slower_step(gpt, overlap):
    """Budgets from below the weights' total to above it: the chosen step (simulated, the
    optimizer after it or overlapped) is non-increasing up to the chooser's tie, and every
    budget that fits keeps fitting."""
    graph, cost, state = gpt
    facts = param_facts(graph, state, cost)
    total = sum(f.freed for f in facts)
    steps = []
    for fraction in (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.3):
        try:
            c = choose_weights(graph, int(total * fraction), cost, state,
                               simulate=_sim(cost), host_adam_rate=2e7, overlap=overlap)
        except InfeasibleBudgetError:
            assert not steps, f"{fraction} of the weights refused after a smaller one fitted"
            continue
        steps.append((fraction, c.total_seconds, len(c.placement.params)))
    assert len(steps) >= 5, steps
    for (fa, ta, _), (fb, tb, _) in itertools.pairwise(steps):
        assert tb <= ta * (1 + TIE), f"{fb} of the weights is slower than {fa}: {steps}"
    assert steps[-1][2] == 0  # everything fits: nothing held


def _lacking(held_needed: int):
    """outcore-checkpoint, but refusing (lacking one byte) any placement holding fewer than
    ``held_needed`` parameters: the planners' own lack is far below one parameter's bytes."""
    def planner(graph, room, cost, lowerer):
        held = lowerer.keywords["weights"].params
        if len(held) < held_needed:
            raise InfeasibleBudgetError("lacking", room, room + 1)
        return plan_checkpoint(graph, room, cost, lowerer)
    return planner


def test_a_tiny_lack_grows_past_the_failed_prefix(gpt):
    """The 7B-at-80-GiB shape at small scale: the need's prefix overshoots its target, the
    planners lack a byte, and growing the target by that byte names the same prefix. The
    search must move on to longer prefixes and find the shortest fitting one, not fall
    back to holding every parameter."""
    graph, cost, state = gpt
    facts = param_facts(graph, state, cost)
    total = sum(f.freed for f in facts)
    budget = int(total * 0.8)  # a slow host optimizer below: the fewest held win
    plain = choose_weights(graph, budget, cost, state, simulate=_sim(cost), host_adam_rate=1e6,
                           planners={"outcore-checkpoint": plan_checkpoint})
    k = len(plain.placement.params)
    holdable = sum(f.holdable for f in facts)
    assert 0 < k < holdable - 3
    held_needed = k + 3
    c = choose_weights(graph, budget, cost, state, simulate=_sim(cost), host_adam_rate=1e6,
                       planners={"outcore-checkpoint": _lacking(held_needed)})
    assert len(c.placement.params) < holdable, "fell back to holding every parameter"
    fitting = [t for t in c.tried if t.fits]
    assert min(t.params for t in fitting) == held_needed  # the shortest fitting prefix
    # and the larger budget keeps the smaller budget's plan available
    roomier = choose_weights(graph, int(total * 0.9), cost, state, simulate=_sim(cost),
                             host_adam_rate=1e6,
                             planners={"outcore-checkpoint": _lacking(held_needed)})
    assert roomier.total_seconds <= c.total_seconds * (1 + TIE)


def test_the_search_never_plans_the_same_prefix_twice_per_ranking(gpt):
    graph, cost, state = gpt
    total = sum(f.freed for f in param_facts(graph, state, cost))
    c = choose_weights(graph, int(total * 0.6), cost, state, simulate=_sim(cost),
                       host_adam_rate=1e6, planners={"outcore-checkpoint": _lacking(6)})
    seen = [(t.ranking, t.params) for t in c.tried]
    assert len(seen) == len(set(seen))
    assert search.STEPS >= 1


def test_plan_prices_the_host_optimizer_from_the_profile(gpt):
    """``outcore.plan(..., optimizer=)`` without ``host_adam_rate`` uses the profile's
    ``host_adam_rate``; the spec's constant only when the profile has no host figures.
    Every parameter held: the step is at least the CPU's step of all of them."""
    graph, _, state = gpt
    facts = param_facts(graph, state, None)
    total = sum(f.freed for f in facts)
    numel = sum(f.numel for f in facts if f.holdable)
    base = cost_model_for("a100-40gb", graph).profile

    def step(prof, **kw):
        p = outcore.plan(graph, int(total * 0.6), optimizer="adamw",
                         cost=AnalyticCostModel(prof), weights="host", cache=False, **kw)
        assert len(p.weights.held) == sum(f.holdable for f in facts)
        return p.weights.total_seconds

    slow = dataclasses.replace(base, host_adam_rate=1e6)
    cpu = step_seconds({"host": numel}, slow)[1]
    assert cpu == pytest.approx(numel / 1e6)
    assert step(slow) >= cpu
    fast = step(dataclasses.replace(base, host_adam_rate=1e11))
    assert fast < cpu  # the profile's fast rate was used, not a constant
    bare = dataclasses.replace(base, host_adam_rate=None, host_memory_bandwidth=None)
    fallback = step(bare)
    assert fallback >= numel / HOST_ADAM_RATE
    assert fallback < cpu
    assert step(bare, host_adam_rate=1e6) >= cpu  # given: it wins over both


@pytest.fixture(scope="module")
def mlp():
    return mlp_case()


def test_overlap_changes_the_decision_and_the_chooser_follows_it(mlp):
    """All 2^6 placements of a tiny MLP, each timed with the optimizer after the pass and
    overlapped with backward. Here the two objectives pick different placements: the
    overlapped chooser's step is the overlapped optimum (and the additive optimum is
    slower under overlap), and the overlapped bound is below every placement."""
    graph, cost, state = mlp
    facts = param_facts(graph, state, cost)
    budget = int(sum(f.freed for f in facts) * 0.9)
    rate = 3e8
    additive, overlapped = {}, {}
    for held, a in every_placement(
            facts, lambda held: choose_weights(graph, budget, cost, state, simulate=_sim(cost),
                                               host_adam_rate=rate, given=held)):
        o = choose_weights(graph, budget, cost, state, host_adam_rate=rate, given=held,
                           overlap=True)
        assert o.total_seconds <= a.total_seconds * (1 + 1e-9)  # overlap only hides
        additive[held], overlapped[held] = a.total_seconds, o.total_seconds
    by_additive = min(additive, key=additive.get)
    best = min(overlapped.values())
    assert overlapped[by_additive] > best * (1 + 1e-3), "overlap changes the decision here"
    chosen = choose_weights(graph, budget, cost, state, host_adam_rate=rate, overlap=True)
    # the optimum up to the chooser's tie (placements whose steps all hide behind
    # backward differ by parts per million), far below the additive pick's loss
    assert chosen.total_seconds <= best * (1 + TIE)
    assert chosen.total_seconds < overlapped[by_additive]
    assert chosen.bound is not None and chosen.bound.seconds <= best * (1 + 1e-12)
