"""The ``outcore-optimal`` policy and the step-time lower bound every PlannedStep reports."""

from __future__ import annotations

from typing import Any

from outcore.graph.ir import Graph
from outcore.policies.optimal.planner import (
    EXACT_CANDIDATES,
    LARGE_CANDIDATES,
    NAME,
    _bound,
    lowest_peak,
    plan_optimal,
)
from outcore.policies.optimal.problem import build_problem
from outcore.policies.optimal.quiet import highs_quiet
from outcore.policies.optimal.stage_bound import stage_bound
from outcore.policies.registry import PolicyContext, PolicyOutput, register

_CACHE_KEY = "_outcore_optimal_bounds"
#: Relative float noise of summing the same op times in another order.
ROUNDING = 1e-9


def lower_bound(graph: Graph, budget: int | None, cost: Any) -> float | None:
    """A lower bound on the simulated step time of every Plan lowered by
    ``outcore.plan.lower`` for ``graph`` within ``budget`` on ``cost`` (framework kernels,
    one sub-batch); None without a budget or a cost model. Cached per graph.

    The larger of two honest bounds: the bound model's LP (its MILP up to
    ``EXACT_CANDIDATES`` candidates; skipped beyond ``LARGE_CANDIDATES``, where it takes
    minutes) and the stage bound (``stage_bound``: one small LP per stage of largest
    excess, seconds on 10^4 layers)."""
    if budget is None or cost is None:
        return None
    cache: dict[tuple[int, str], float] = graph.meta.setdefault(_CACHE_KEY, {})
    key = (int(budget), repr(cost))
    if key not in cache:
        problem = build_problem(graph, cost, int(budget))
        with highs_quiet():
            found = stage_bound(problem)
            if len(problem.candidates) <= LARGE_CANDIDATES:
                found = max(found, _bound(problem, len(problem.candidates) <= EXACT_CANDIDATES))
        if found <= problem.in_core_time * (1 + ROUNDING):
            # the in-core step summed in another order: no bound above the step of a plan
            # that keeps everything (lowering it to the in-core step keeps it a bound)
            found = problem.in_core_time
        cache[key] = found
    return cache[key]


def floor(graph: Graph, cost: Any) -> int:
    """The lowest peak any plan of keep / offload / recompute decisions of ``graph`` reaches
    on ``cost`` (one sub-batch): every activation freed over its whole gap. outcore-optimal
    refuses any budget below it with exactly this figure."""
    return lowest_peak(build_problem(graph, cost, 1))


@register(NAME, "outcore's joint model: keep, offload (with its prefetch point) or recompute "
          "each activation to minimise the step time on the cost model within the budget, "
          "solved with HiGHS (exact MILP on small graphs, LP relaxation + MILP on its "
          "fractional part beyond); reports a proven lower bound on the step time")
def optimal_policy(graph: Graph, ctx: PolicyContext) -> PolicyOutput:
    if ctx.budget is None or ctx.cost is None:
        from outcore.plan.lower import lower
        from outcore.plan.plan import Plan

        plan = Plan(policy=NAME, budget=ctx.budget)
        return PolicyOutput(plan, lower(graph, plan), graph)
    # the bound is computed on demand (``lower_bound``, when outcore.plan reports it): the
    # portfolio that runs this policy ranks plans by their simulated step alone
    with highs_quiet():  # HiGHS's stray C printf would reach the user's stdout
        result = plan_optimal(graph, ctx.budget, ctx.cost, bound=False)
    return PolicyOutput(result.plan, result.schedule, graph)
