"""``fused-first``: recompute fused element-wise work first, a matrix product only when forced.

The inductor backend's own recompute-only planner for graphs as a fusing compiler runs them
(Inductor's joint graph as ``fusion`` contracts it); ``partition.OutcorePartitioner`` plans
with it beside outcore-auto (``plan_fused_first``). It is not a registered policy: it knows
nothing of offloads or sub-batches, and its peak is not monotone in the budget.

On a fused graph every element-wise op, reduction and norm is part of one fused kernel;
recomputing it in the backward costs one pass over memory, while recomputing a
matrix product, a convolution or an attention kernel costs its full flops again. Segment
checkpointing (outcore-checkpoint) replays whole blocks, matrix products included, and
selective checkpointing (torchtitan's "op" policy) never recomputes them at all.
``fused-first`` takes the middle road, in three steps, each checked on the memory rule
(``plan.memory.memory_curve`` of the lowered schedule):

1. **Fused values first.** Every forward base value not made by a heavy op (``HEAVY``:
   matmul, convolution, attention) is recomputed, intermediates the backward never reads
   included (``lower.forward_intermediates``): a recompute chain rebuilds them from the
   heavy outputs it keeps, so nothing cheap stays alive from forward to backward.
2. **A heavy output only when memory forces it.** While the peak is above the budget, the
   heavy output whose recompute lowers the peak the most per recomputed flop is recomputed
   too (each candidate lowered and measured; recomputing them all would replay the whole
   forward at the backward's start, no lower than keeping them). When none lowers the peak
   and it is still above the budget: ``InfeasibleBudgetError`` with the peak reached.
3. **Keep back.** Memory the budget leaves is spent on keeping values: first those whose
   producer draws random numbers inline (``graph.meta[INLINE_DRAWS]``, most draws per byte
   first: a dropout mask kept as one byte per element spares the generator its whole
   draw), then those whose recompute costs the most time per byte: a prefix of that order
   by bisection, then single values (at most ``KEEP_TRIES`` more lowerings).

Invariants: the plan only recomputes (nothing offloaded, no sub-batches), so a fusing
compiler's partition can run it; the returned schedule's peak is at most the budget (the
memory rule of every policy); without a budget nothing is recomputed (liveness). The order
of every step is by op id on ties, so the plan is deterministic.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from outcore.errors import InfeasibleBudgetError
from outcore.graph.ir import Graph, OpCategory
from outcore.plan.lower import forward_intermediates, lower
from outcore.plan.memory import memory_curve
from outcore.plan.plan import Decision, Plan
from outcore.plan.schedule import Schedule
from outcore.planned import PlannedStep, cost_model_for

#: Ops whose recompute costs real flops: recomputed only when the budget forces it.
HEAVY = frozenset({OpCategory.MATMUL, OpCategory.CONV, OpCategory.ATTENTION})
#: Single-value keep-back tries after the bisected prefix (each one a lowering).
KEEP_TRIES = 64
NAME = "fused-first"
#: ``graph.meta`` key: op id -> random elements the op draws inline (set by
#: ``outcore.compiled``: Inductor's generator is far slower per element than a memory pass).
INLINE_DRAWS = "inline_draws"


def _price(graph: Graph, cost: object) -> Callable[[int], float]:
    """Seconds (or flops without a cost model) to recompute a value, per byte it frees."""
    bound = cost.bind(graph) if hasattr(cost, "bind") else cost  # type: ignore[union-attr]
    timed = getattr(bound, "op_time", None)

    def price(tid: int) -> float:
        op = graph.producer_op(tid)
        work = float(timed(op)) if timed is not None else float(op.flops)
        return work / max(graph.tensors[tid].nbytes, 1)

    return price


def _flops_per_byte(graph: Graph, tid: int) -> float:
    """Flops to recompute a value per byte it frees (the order of step 2)."""
    return float(graph.producer_op(tid).flops) / max(graph.tensors[tid].nbytes, 1)


def _plan(recompute: Iterable[int]) -> Plan:
    plan = Plan(policy=NAME)
    for tid in sorted(recompute):
        plan.decisions[tid] = Decision.RECOMPUTE
    return plan


class _Lowering:
    """Lowers recompute sets of one graph under one budget: their peak and schedule."""

    def __init__(self, graph: Graph, budget: int) -> None:
        self.graph, self.budget = graph, budget

    def peak(self, recompute: set[int]) -> tuple[int, Schedule]:
        schedule = lower(self.graph, _plan(recompute))
        return memory_curve(self.graph, schedule).peak, schedule


def _force_heavy(low: _Lowering, recompute: set[int], heavy: list[int]) -> tuple[int, Schedule]:
    """Step 2: while the peak is above the budget, recompute the heavy output that lowers it
    the most per recomputed flop (ties: ``heavy``'s order); refuse when none lowers it."""
    peak, schedule = low.peak(recompute)
    left = list(heavy)
    while peak > low.budget and left:
        best: tuple[float, int, int, Schedule] | None = None
        for tid in left:
            trial, trial_schedule = low.peak(recompute | {tid})
            gain = (peak - trial) / max(float(low.graph.producer_op(tid).flops), 1.0)
            if trial < peak and (best is None or gain > best[0]):
                best = (gain, tid, trial, trial_schedule)
        if best is None:
            break
        _, tid, peak, schedule = best
        recompute.add(tid)
        left.remove(tid)
    if peak > low.budget:
        raise InfeasibleBudgetError(
            NAME, low.budget, peak, "Recomputing more matrix products lowers this plan's peak "
            "no further: raise the budget, or use policy='auto' (segments, offload).")
    return peak, schedule


def _keep_back(low: _Lowering, recompute: set[int], order: list[int],
               fitted: tuple[int, Schedule]) -> tuple[set[int], Schedule]:
    """Step 3: keep a prefix of ``order`` (bisected), then single values, while it fits."""
    best = fitted[1]
    lo, hi = 0, len(order)  # keeping order[:lo] fits; order[:hi + 1] is not known to
    while lo < hi:
        mid = (lo + hi + 1) // 2
        peak, schedule = low.peak(recompute - set(order[:mid]))
        if peak <= low.budget:
            lo, best = mid, schedule
        else:
            hi = mid - 1
    chosen = recompute - set(order[:lo])
    for tid in order[lo + 1:lo + 1 + KEEP_TRIES]:
        peak, schedule = low.peak(chosen - {tid})
        if peak <= low.budget:
            chosen.discard(tid)
            best = schedule
    return chosen, best


def fused_first_plan(graph: Graph, budget: int | None, cost: object) -> tuple[Plan, Schedule]:
    """The plan and schedule of the module docstring's three steps."""
    if budget is None:
        plan = _plan(())
        return plan, lower(graph, plan)
    price = _price(graph, cost)
    rebuild = sorted(forward_intermediates(graph))
    heavy = sorted((t for t in rebuild if graph.producer_op(t).category in HEAVY),
                   key=lambda t: (_flops_per_byte(graph, t), t))
    recompute = {t for t in rebuild if graph.producer_op(t).category not in HEAVY}
    low = _Lowering(graph, budget)
    fitted = _force_heavy(low, recompute, heavy)
    draws = graph.meta.get(INLINE_DRAWS, {})

    def drawn(tid: int) -> float:
        return draws.get(graph.tensors[tid].producer, 0) / max(graph.tensors[tid].nbytes, 1)

    order = sorted(recompute, key=lambda t: (-drawn(t), -price(t), t))
    chosen, schedule = _keep_back(low, recompute, order, fitted)
    plan = _plan(chosen)
    plan.budget = budget
    for tid in chosen:
        op = graph.producer_op(tid)
        plan.reasons[tid] = (f"recomputed in backward ({op.category} {op.target}): "
                             + ("forced by the budget" if op.category in HEAVY
                                else "fused work, cheap to redo"))
    return plan, schedule


def plan_fused_first(graph: Graph, budget: int | None, gpu: str | None,
                     scope: str = "step") -> PlannedStep:
    """``fused_first_plan`` priced on ``gpu``'s profile, as ``outcore.plan`` returns a plan:
    the schedule's peak under the memory rule and its simulated step. ``scope`` is
    ``outcore.plan``'s: under "activations" the budget bounds the peak of a scoped copy of
    ``graph`` (``outcore.plan.scope``), which is the returned ``scoped_peak``."""
    from outcore.plan.scope import ACTIVATIONS, check_scope, scoped_copy
    from outcore.sim import simulate

    model = cost_model_for(gpu, graph)
    planned_on = scoped_copy(graph) if check_scope(scope) == ACTIVATIONS else graph
    plan, schedule = fused_first_plan(planned_on, budget, model)
    scoped = memory_curve(planned_on, schedule).peak
    return PlannedStep(graph, plan, schedule, memory_curve(graph, schedule).peak, budget,
                       simulate(graph, schedule, model), scope=scope, scoped_peak=scoped)
