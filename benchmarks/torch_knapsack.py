"""PyTorch's own activation-memory-budget knapsack, run on an outcore graph's costs and sizes
and mapped to an outcore Plan of keep / recompute, for ``planner_table.py``.

What torch does (``torch._functorch.partitioners.choose_saved_values_set``, torch 2.13): with
``torch._functorch.config.activation_memory_budget = b`` in [0, 1], the recomputable
activations are knapsack items; item ``i`` weighs its bytes normalised by the span between
"save only the inputs" and "save everything", is worth its runtime (FLOP estimate by
default), and the solver (``activation_memory_budget_solver``: ``dp`` by default, ``greedy``,
``ilp``) keeps the most runtime within total weight ``b``; every item it does not keep is
recomputed in backward.

The mapping here, and where it is approximate:

* items: every movable activation of the outcore graph (a base tensor read in backward,
  ``movable_activations``); weight: its bytes over the sum of all items' bytes (torch's
  "min" is the inputs, which are not items here either); value: the cost model's
  ``op_time`` of its producer (the same cost model every other column uses, instead of
  torch's FLOP count). Torch's min-cut pass, which widens the saved set to a consistent cut
  of fusible chains, is not run: outcore's lowering recomputes an unsaved tensor from its
  producer, recursively through producers whose outputs were recomputed as well.
* the budget: torch's ``b`` bounds the *total* bytes saved, not the peak. The mapping picks
  the largest ``b`` (bisection, ``STEPS`` rounds) whose plan's peak under outcore's memory
  rule fits the budget, as a user tuning ``activation_memory_budget`` for their card would.
  The peak need not fall monotonically with ``b``; bisection is kept anyway (it is what a
  user would do) and the best fitting ``b`` seen is used.
* recompute only: a budget that even ``b = 0`` (recompute everything) misses has no torch
  plan.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch._functorch._activation_checkpointing import knapsack

from outcore.graph.ir import Graph
from outcore.plan.lower import lower
from outcore.plan.memory import memory_curve
from outcore.plan.plan import Decision, Plan
from outcore.plan.schedule import Schedule
from outcore.policies.baseline import movable_activations

#: torch's solvers by the names of ``activation_memory_budget_solver``
SOLVERS: dict[str, Callable[[list[float], list[float], float],
                            tuple[float, list[int], list[int]]]] = {
    "dp": knapsack.dp_knapsack,
    "greedy": knapsack.greedy_knapsack,
    "ilp": knapsack.ilp_knapsack,
}
STEPS = 12


@dataclass
class TorchKnapsack:
    """The plan torch's knapsack gives at the largest fitting ``fraction``, its schedule and
    its predicted peak; ``evaluations``: plans lowered during the bisection."""

    plan: Plan
    schedule: Schedule
    peak: int
    fraction: float
    evaluations: int


def torch_knapsack_plan(graph: Graph, budget: int, cost: object, solver: str = "dp"
                        ) -> TorchKnapsack | None:
    """Torch's knapsack plan for ``graph`` that fits ``budget`` (see the module doc), or None
    when recomputing every activation does not fit."""
    items = movable_activations(graph)
    sizes = [graph.tensors[t].nbytes for t in items]
    total = sum(sizes) or 1
    memory = [max(s, 1) / total for s in sizes]  # torch divides runtime by memory
    bound = cost.bind(graph)  # type: ignore[attr-defined]
    runtimes = [float(bound.op_time(graph.producer_op(t))) for t in items]
    solve = SOLVERS[solver]

    def attempt(fraction: float) -> TorchKnapsack:
        _, saved, _ = solve(memory, runtimes, fraction)
        keep = {items[i] for i in saved}
        plan = Plan(policy=f"torch-knapsack ({solver})", budget=budget)
        for t in items:
            if t not in keep:
                plan.decisions[t] = Decision.RECOMPUTE
                plan.reasons[t] = (f"torch's {solver} knapsack at activation_memory_budget="
                                   f"{fraction:.4f} did not save it")
        schedule = lower(graph, plan)
        return TorchKnapsack(plan, schedule, memory_curve(graph, schedule).peak, fraction, 0)

    evaluations = 1
    best = attempt(1.0)
    if best.peak > budget:
        best = attempt(0.0)
        evaluations += 1
        if best.peak > budget:
            return None
        low, high = 0.0, 1.0
        for _ in range(STEPS):
            mid = (low + high) / 2
            found = attempt(mid)
            evaluations += 1
            if found.peak <= budget:
                low = mid
                if mid > best.fraction:
                    best = found
            else:
                high = mid
    best.evaluations = evaluations
    return best
