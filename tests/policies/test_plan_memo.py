"""Each planner runs once per outcore-auto plan: outcore-optimal warm-starts from
outcore-checkpoint's and the greedy planner's plans, and the portfolio's own candidates of
those names return the very same runs (``outcore.policies.auto.memo``)."""

from outcore.api import cost_model_for
from outcore.errors import InfeasibleBudgetError
from outcore.graph.bounds import reference_peaks
from outcore.policies.auto import (
    greedy_policy,
    memoized,
    plan_memo,
    run_portfolio,
    segments,
)
from outcore.policies.auto import policy as auto_policy_module
from outcore.policies.optimal import planner as optimal_planner
from outcore.policies.registry import PolicyContext, get
from outcore.sim.synthetic import residual_chain


def _counting(monkeypatch, module, name):
    calls = []
    real = getattr(module, name)

    def wrapper(*args, **kwargs):
        calls.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)
    return calls


def _case():
    graph = residual_chain(6, activation_bytes=1 << 28, conv_flops=4e9)
    cost = cost_model_for("v100-pcie")
    return graph, cost, int(reference_peaks(graph).liveness * 0.7)


def test_checkpoint_and_greedy_run_once_per_portfolio(monkeypatch):
    monkeypatch.setattr(optimal_planner, "EXACT_CANDIDATES", 0)  # the warm-started search
    checkpoint = _counting(monkeypatch, segments, "plan_checkpoint")
    greedy = _counting(monkeypatch, auto_policy_module, "plan_auto")
    graph, cost, budget = _case()
    result = run_portfolio(graph, PolicyContext(budget=budget, cost=cost),
                           ("outcore-optimal", "outcore-auto", "outcore-checkpoint"),
                           {"outcore-auto": greedy_policy}, skip=False)
    assert all(e.fits for e in result.entries), [(e.name, e.why_not()) for e in result.entries]
    assert checkpoint == [budget] and greedy == [budget]
    # the candidates' outputs are those runs (read-only: the portfolio copies before naming)
    by_name = {e.name: e.output for e in result.entries}
    assert by_name["outcore-checkpoint"].plan.policy == "outcore-checkpoint"


def test_outside_a_portfolio_each_call_plans_again(monkeypatch):
    """Without a memo block nothing is shared (no plan outlives the plan call that made it)."""
    monkeypatch.setattr(optimal_planner, "EXACT_CANDIDATES", 0)
    checkpoint = _counting(monkeypatch, segments, "plan_checkpoint")
    graph, cost, budget = _case()
    ctx = PolicyContext(budget=budget, cost=cost)
    get("outcore-optimal").fn(graph, ctx)
    get("outcore-checkpoint").fn(graph, ctx)
    assert checkpoint == [budget, budget]


def test_memo_remembers_an_infeasible_budget_and_keys_by_budget():
    graph, cost, _ = _case()
    runs = []

    def refuse():
        runs.append(1)
        raise InfeasibleBudgetError("t", 1, 2, "no")

    with plan_memo():
        for _ in range(2):
            try:
                memoized("t", graph, 1, cost, refuse)
            except InfeasibleBudgetError as exc:
                assert exc.required == 2
        assert memoized("t", graph, 3, cost, lambda: "other budget") == "other budget"
        with plan_memo():  # a nested block joins the outer one
            assert memoized("t", graph, 3, cost, lambda: "again") == "other budget"
    assert runs == [1]
    assert memoized("t", graph, 3, cost, lambda: "fresh") == "fresh"


def test_one_checkpoint_run_per_outcore_plan_call(monkeypatch):
    import outcore

    monkeypatch.setattr(optimal_planner, "EXACT_CANDIDATES", 0)
    checkpoint = _counting(monkeypatch, segments, "plan_checkpoint")
    graph, cost, budget = _case()
    for _ in range(2):  # and nothing is kept between calls: the second call plans again
        planned = outcore.plan(graph, budget, policy="outcore-auto", cost=cost, cache=False,
                               host_budget=None)
        assert planned.plan.policy.startswith("outcore-auto")
    assert checkpoint == [budget, budget]
