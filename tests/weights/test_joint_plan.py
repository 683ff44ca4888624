"""The weights planned jointly with the activations: the lower bound against every placement
of a tiny model, the search, and ``outcore.plan(..., optimizer=...)``'s report."""

import math

import pytest
import torch
from weights_helpers import every_placement, make_gpt, mlp_case, token_loss

import outcore
from outcore.api import cost_model_for
from outcore.errors import InfeasibleBudgetError, InvalidArgumentError
from outcore.sim import simulate
from outcore.weights import search
from outcore.weights.bound import joint_lower_bound, min_cover, param_facts
from outcore.weights.choose import choose_weights
from outcore.weights.spec import OptimizerSpec, graph_state_bytes, spec_of


@pytest.fixture(scope="module")
def mlp():
    return mlp_case()


def _sim(cost):
    return lambda g, s: simulate(g, s, cost).step_time


@pytest.mark.parametrize("fraction", [0.75, 0.45])
def test_bound_is_below_every_placement_of_a_tiny_model(mlp, fraction):
    """All 2^6 placements planned: the bound is below the fastest, the chooser finds one no
    slower than the prefixes of the bytes ranking (the search it replaced)."""
    graph, cost, state = mlp
    facts = param_facts(graph, state, cost)
    budget = int(sum(f.freed for f in facts) * fraction)
    rate = 2e7  # a slow host optimizer: holding has a price
    totals = {held: c.total_seconds for held, c in every_placement(
        facts, lambda held: choose_weights(graph, budget, cost, state, simulate=_sim(cost),
                                           host_adam_rate=rate, given=held))}
    assert totals, "some placement fits"
    best = min(totals.values())
    chosen = choose_weights(graph, budget, cost, state, simulate=_sim(cost),
                            host_adam_rate=rate)
    assert chosen.bound is not None
    assert chosen.bound.seconds <= best * (1 + 1e-12)
    assert chosen.total_seconds >= best * (1 - 1e-12)
    assert chosen.gap is not None and chosen.gap >= 0
    # the chooser's pick is the fastest of what it tried
    assert chosen.total_seconds == min(c.total_seconds for c in chosen.tried if c.fits)
    order = search.rankings(facts, {}, lambda h, d: 0.0)["bytes"]
    freed = {f.name: f.freed for f in facts}
    total = sum(freed.values())
    prefixes = {search.prefix(order, freed, f * total) for f in (0, .125, .25, .5, .75, 1)}
    old = [totals[tuple(sorted(p, key=[f.name for f in facts].index))]
           for p in prefixes if tuple(sorted(p, key=[f.name for f in facts].index)) in totals]
    assert old and chosen.total_seconds <= min(old) * (1 + 1e-12)


def test_bound_terms_follow_the_budget(mlp):
    graph, cost, state = mlp
    facts = param_facts(graph, state, cost)
    total = sum(f.freed for f in facts)
    roomy = joint_lower_bound(graph, 2 * total, cost, state)
    tight = joint_lower_bound(graph, total // 2, cost, state)
    assert roomy.need == 0 and roomy.copies == 0
    assert tight.need == total - total // 2
    assert tight.copies > 0 and tight.optimizer > roomy.optimizer
    assert tight.seconds > roomy.seconds
    assert joint_lower_bound(graph, -1, cost, state) is None  # even all held is not enough


def test_min_cover_is_the_fractional_covering_knapsack():
    assert min_cover([(10, 1.0), (10, 3.0)], 0) == 0.0
    assert min_cover([(10, 1.0), (10, 3.0)], 15) == pytest.approx(1.0 + 1.5)
    assert min_cover([(10, 3.0), (10, 1.0)], 10) == pytest.approx(1.0)
    assert min_cover([(10, 1.0)], 11) == math.inf


def test_search_is_deterministic_and_starts_at_the_need(mlp):
    graph, cost, state = mlp
    facts = param_facts(graph, state, cost)
    total = sum(f.freed for f in facts)
    a = choose_weights(graph, total // 2, cost, state, simulate=_sim(cost))
    b = choose_weights(graph, total // 2, cost, state, simulate=_sim(cost))
    assert a.placement == b.placement
    assert [(c.ranking, c.params) for c in a.tried] == [(c.ranking, c.params) for c in b.tried]
    need = total - total // 2
    assert all(c.held_bytes >= need for c in a.tried)


def test_exposure_weighs_the_layer_position():
    """The first parameter read in forward has nothing before it to hide its prefetch."""
    model, batch = make_gpt()
    graph = outcore.capture(model, token_loss, batch)
    cost = cost_model_for("a100-40gb", graph)
    facts = param_facts(graph, graph_state_bytes(graph, "adamw"), cost)
    from outcore.weights.bound import op_times

    exposed = search.exposure(graph, facts, op_times(graph, cost))
    first = next(f for f in facts if f.name == "tok.weight")
    assert exposed["tok.weight"] >= first.h2d
    hidden = [n for n, e in exposed.items() if e == 0.0]
    assert hidden, "some parameter's copies hide behind a matmul"


def test_optimizer_specs():
    adamw = spec_of("adamw")
    assert adamw.state_bytes(10, 4) == 8 * 10 + 4
    assert adamw.state_bytes(10, 2) == 12 * 10 + 4  # fp32 master of a bf16 weight
    assert spec_of("sgd").state_bytes(10, 4) == 40
    assert OptimizerSpec("x", bytes_per_element=6, step_bytes=0).state_bytes(10, 2) == 60
    net = torch.nn.Linear(4, 4)
    built = spec_of(torch.optim.AdamW(net.parameters(), amsgrad=True))
    assert built.state_bytes(10, 4) == 3 * 4 * 10 + 4
    with pytest.raises(InvalidArgumentError):
        spec_of("lion")
    assert spec_of(torch.optim.Adagrad(net.parameters())).state_bytes(10, 4) == 4 * 10 + 4
    with pytest.raises(InvalidArgumentError):
        spec_of(torch.optim.LBFGS(net.parameters()))


@pytest.fixture(scope="module")
def gpt_graph():
    model, batch = make_gpt()
    return model, outcore.capture(model, token_loss, batch)


def test_plan_with_an_optimizer_reports_the_weights(gpt_graph):
    model, graph = gpt_graph
    weights = sum(p.numel() * 4 for p in model.parameters())
    budget = int(1.5 * weights)  # weights + grads + AdamW = 4x the weights
    planned = outcore.plan(graph, budget, optimizer="adamw", gpu="a100-40gb", cache=False)
    w = planned.weights
    assert w is not None and w.held
    assert planned.predicted_peak + w.device_state <= budget
    assert w.host_bytes == w.host_copies + w.host_state
    assert w.host_copies >= w.held_weights
    assert 1.0 <= w.pinned_ratio <= 1.05
    assert planned.simulation is not None
    assert w.step_seconds == pytest.approx(planned.simulation.step_time)
    assert w.total_seconds == pytest.approx(w.step_seconds + w.optimizer_seconds)
    assert planned.lower_bound is not None and planned.gap is not None and planned.gap >= 0
    rows = planned.explain()
    assert [r["parameter"] for r in rows.parameters] == w.held
    assert any(n.startswith("weights:") for n in rows.notes)
    assert any("lower bound" in line for line in w.lines)
    assert sum(line.startswith("chosen: ") for line in w.lines) == 1


def test_plan_with_the_torch_optimizer_sizes_its_own_state(gpt_graph):
    model, graph = gpt_graph
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # no momentum: no state
    weights = sum(p.numel() * 4 for p in model.parameters())
    planned = outcore.plan(graph, 4 * weights, optimizer=opt, gpu="a100-40gb", cache=False)
    assert planned.weights.device_state == 0 and not planned.weights.held


def test_budgets_no_placement_reaches_are_refused_with_the_ways_out(gpt_graph):
    model, graph = gpt_graph
    weights = sum(p.numel() * 4 for p in model.parameters())
    with pytest.raises(InfeasibleBudgetError) as info:
        outcore.plan(graph, weights // 4, optimizer="adamw", gpu="a100-40gb", cache=False)
    exc = info.value
    assert exc.lowest is not None and exc.lowest > weights // 4
    assert "Ways out" in str(exc) and "every parameter" in str(exc)
    with pytest.raises(InfeasibleBudgetError) as info:
        outcore.plan(graph, int(1.5 * weights), optimizer="adamw", weights="device",
                     gpu="a100-40gb", cache=False)
    assert "weights='auto'" in str(info.value)


def test_weights_arguments_are_checked(gpt_graph):
    _, graph = gpt_graph
    with pytest.raises(InvalidArgumentError):
        outcore.plan(graph, "1GB", weights="host", cache=False)
    with pytest.raises(InvalidArgumentError):
        outcore.plan(graph, "1GB", optimizer="adamw", policy="checkmate", cache=False)
    with pytest.raises(InvalidArgumentError):
        outcore.plan(graph, "1GB", optimizer="adamw", weights="disk", cache=False)
    with pytest.raises(InvalidArgumentError):
        outcore.plan(graph, None, optimizer="adamw", cache=False)


def test_compile_with_an_optimizer_plans_the_weights():
    """``outcore.compile(..., optimizer=opt)``: the step's gradients equal eager's."""
    from weights_helpers import eager_grads

    model, batch = make_gpt()
    ref, _ = eager_grads(model, batch)
    opt = torch.optim.AdamW(model.parameters())
    weights = sum(p.numel() * 4 for p in model.parameters())
    with outcore.compile(model, token_loss, batch, optimizer=opt, budget=int(1.5 * weights),
                         device="cpu-emulated") as trainer:
        assert trainer.held()
        torch.manual_seed(11)
        trainer.step(*batch)
        assert trainer.measured_peak == trainer.predicted_peak
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)
