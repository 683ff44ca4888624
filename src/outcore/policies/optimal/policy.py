"""The ``outcore-optimal`` policy and the step-time lower bound every PlannedStep reports."""

from __future__ import annotations

from typing import Any

from outcore.graph.ir import Graph
from outcore.policies.optimal.coarse import coarsen
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
#: ``lower_bound`` solves the full bound model after the coarse one only when the plan's
#: step is more than this above the coarse bound: issue 15's target gap (a plan within it
#: needs no tighter proof). The full model's LP is 4-7x the coarse one's CPU on the planner
#: table's rows and had the same value on 8 of 10 (``coarse``).
REFINE_ABOVE = 0.03


def lower_bound(graph: Graph, budget: int | None, cost: Any,
                step: float | None = None) -> float | None:
    """A lower bound on the simulated step time of every Plan lowered by
    ``outcore.plan.lower`` for ``graph`` within ``budget`` on ``cost`` (framework kernels,
    one sub-batch); None without a budget or a cost model. Cached per graph.

    The larger of two honest bounds: the bound model's LP (its MILP up to
    ``EXACT_CANDIDATES`` candidates; skipped beyond ``LARGE_CANDIDATES``, where it takes
    minutes) and the stage bound (``stage_bound``: one small LP per stage of largest
    excess, seconds on 10^4 layers). Beyond ``EXACT_CANDIDATES`` the LP is first solved on
    the coarse model (``coarse``: fewer prefetch and release options, the same relaxation,
    4-7x less CPU on the planner table's rows); the full model's LP is solved too unless
    ``step`` (the simulated step of the plan the bound is reported with) is already within
    ``REFINE_ABOVE`` of the coarse bound. Without ``step`` the full model is always solved,
    so the value is then the bound of every earlier version."""
    if budget is None or cost is None:
        return None
    cache: dict[tuple[int, str], tuple[float, bool]] = graph.meta.setdefault(_CACHE_KEY, {})
    key = (int(budget), repr(cost))
    found, refined = cache.get(key, (None, False))
    if found is not None and (refined or not _refine(found, step)):
        return found
    problem = build_problem(graph, cost, int(budget))
    with highs_quiet():
        if found is None:
            found = stage_bound(problem)
            refined = len(problem.candidates) > LARGE_CANDIDATES
            if len(problem.candidates) <= EXACT_CANDIDATES:
                found, refined = max(found, _bound(problem, True)), True
            elif not refined:
                found = max(found, _bound(coarsen(problem), False))
        if not refined and _refine(found, step):
            found, refined = max(found, _bound(problem, False)), True
    if found <= problem.in_core_time * (1 + ROUNDING):
        # the in-core step summed in another order: no bound above the step of a plan
        # that keeps everything (lowering it to the in-core step keeps it a bound)
        found = problem.in_core_time
    cache[key] = (found, refined)
    return found


def _refine(found: float, step: float | None) -> bool:
    """Whether the full bound model is worth solving after a bound ``found``: no step is
    known, or the step is more than ``REFINE_ABOVE`` above ``found``."""
    return step is None or step > found * (1 + REFINE_ABOVE)


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
