"""outcore-auto made monotone in its peak by construction (option ``monotone=True``).

outcore-auto keeps the fastest (simulated) plan that fits among its own and the seed
policies'; each of those plans depends on the budget, so the fastest plan at a smaller
budget may have a *higher* peak than the fastest at a larger one (measured: googlenet-small
889,696 B at a budget of 889,912 B but 882,488 B at 934,243 B; the small transformer
408,200 B at 408,617 B but 344,200 B at 464,672 B, ``benchmarks/budget_fidelity.py``).

The ladder removes that by construction. Rung 0 is outcore-auto without a budget (free at
last use); rung k+1 is outcore-auto at one byte below rung k's peak. Peaks strictly fall
from rung to rung. The plan for a budget ``b`` is the first rung whose peak fits ``b``. A
larger budget stops at the same rung or an earlier one, whose peak is at least as high:
**the planned peak never rises as the budget falls**, whatever the planner does between
rungs, and a budget is accepted exactly when outcore-auto accepts one at or below it on the
ladder. The cost is one plan per rung down to ``b`` (17 rungs from the in-core peak to the
lowest feasible on googlenet-small, 172 on resnet20-cifar at batch 8); the rungs are cached
on the graph (``graph.meta["_auto_ladder"]``, per cost model and options), so a sweep over
budgets, or re-planning, pays for each rung once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from outcore.errors import InfeasibleBudgetError
from outcore.graph.ir import Graph
from outcore.plan.memory import memory_curve
from outcore.policies.registry import PolicyContext, PolicyOutput

Planner = Callable[[Graph, PolicyContext], PolicyOutput]


@dataclasses.dataclass
class Ladder:
    """Rungs found so far (peaks strictly falling) and whether the bottom was reached."""

    rungs: list[tuple[int, PolicyOutput]] = dataclasses.field(default_factory=list)
    bottom: InfeasibleBudgetError | None = None


def _ladder(graph: Graph, ctx: PolicyContext) -> Ladder:
    options = {k: v for k, v in ctx.options.items() if k != "monotone"}
    key = (id(ctx.cost), repr(sorted(options.items())))
    ladders = graph.meta.setdefault("_auto_ladder", {})
    if key not in ladders:
        ladders[key] = Ladder()
    ladder: Ladder = ladders[key]
    return ladder


def monotone_plan(graph: Graph, ctx: PolicyContext, planner: Planner) -> PolicyOutput:
    """The first rung of the ladder (module docstring) whose peak fits ``ctx.budget``.

    Raises InfeasibleBudgetError when the ladder's bottom is above the budget."""
    options = {k: v for k, v in ctx.options.items() if k != "monotone"}
    ladder = _ladder(graph, ctx)
    if not ladder.rungs:
        top = planner(graph, dataclasses.replace(ctx, budget=None, options=options, config=None))
        ladder.rungs.append((memory_curve(top.graph, top.schedule).peak, top))
    budget = ctx.budget
    while True:
        for peak, out in ladder.rungs:
            if budget is None or peak <= budget:
                return _copy(out, budget)
        if ladder.bottom is not None:
            raise ladder.bottom
        below = ladder.rungs[-1][0] - 1
        try:
            out = planner(graph, dataclasses.replace(ctx, budget=below, options=options,
                                                    config=None))
        except InfeasibleBudgetError as exc:
            ladder.bottom = exc
            continue
        ladder.rungs.append((memory_curve(out.graph, out.schedule).peak, out))


def _copy(out: PolicyOutput, budget: int | None) -> PolicyOutput:
    """A rung's output for ``budget``, copied so a caller editing its plan leaves the cache
    intact."""
    plan = dataclasses.replace(out.plan, decisions=dict(out.plan.decisions),
                               reasons=dict(out.plan.reasons), budget=budget)
    return PolicyOutput(plan, out.schedule, out.graph)
