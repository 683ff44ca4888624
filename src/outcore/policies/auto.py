"""outcore-auto: outcore's own hybrid keep / offload / recompute planner.

The planner works on the memory peak directly instead of on layer types:

1. Start from free-at-last-use (``liveness``). If its peak fits the budget, keep everything:
   moving nothing costs nothing.
2. Otherwise look at the instruction where the peak occurs, and at the movable activations
   resident across it (allocated before the peak, freed after it). For each, price
   * **recompute**: the producer's time (plus its dropped inputs' producers, since a
     recompute needs its inputs), and
   * **offload**: the transfer time (D2H + H2D) not hidden by the compute that runs between
     the tensor's production and its first backward use (the window in which the copy
     engines can work while the compute stream is busy),
   and take the cheaper action per byte freed.
3. Decide, cheapest seconds-per-byte first, enough tensors to cover the excess at that
   peak; re-lower and repeat at the new peak. Each round removes at least one candidate,
   so it ends; when no candidate is left and the peak is still above the budget, the budget
   is infeasible and the error names the lowest peak reached.

Every step is plain Python over the Graph, the cost model and ``plan.memory`` (the same rule
the executor measures), so the predicted peak of the result is what the device will see.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from outcore.cost.model import CostModel
from outcore.errors import InfeasibleBudgetError
from outcore.graph.ir import Graph, OpCategory, Phase
from outcore.plan.lower import lower
from outcore.plan.memory import memory_curve
from outcore.plan.plan import Decision, Plan
from outcore.plan.residency import no_workspace, residency_steps
from outcore.plan.schedule import Schedule
from outcore.policies.baseline import movable_activations
from outcore.policies.registry import PolicyContext, PolicyOutput, register

MAX_ROUNDS = 10_000


@dataclass(frozen=True)
class Choice:
    """The cheaper way to drop one activation at the peak, and what it costs."""

    tensor: int
    decision: Decision
    seconds: float
    nbytes: int
    why: str


def _resident_spans(graph: Graph, schedule: Schedule) -> dict[int, list[tuple[int, int]]]:
    """Base tensor -> [(first index resident, index of its Free or len(schedule))] per
    residency of that tensor, in schedule order, from the memory rule's replay
    (``outcore.plan.residency``). Static tensors' initial residency is left out. A span ends
    at the base's own Free, even when a view of it keeps the storage resident longer."""
    tensors = graph.tensors
    spans: dict[int, list[tuple[int, int]]] = {}
    open_at: dict[int, int] = {}
    for step in residency_steps(graph, schedule, no_workspace):
        if step.at < 0:
            continue
        for tid in step.made_resident:
            if not tensors[tid].is_view:
                open_at[tid] = step.at
        if step.dropped in open_at:
            spans.setdefault(step.dropped, []).append((open_at.pop(step.dropped), step.at))
    end = len(schedule)
    for tid, start in open_at.items():
        spans.setdefault(tid, []).append((start, end))
    return spans


class _Pricer:
    """Prices recompute and offload for one graph under one cost model."""

    def __init__(self, graph: Graph, cost: CostModel | None) -> None:
        self.graph = graph
        self.cost = cost
        self.op_time = [self._time(op_id) for op_id in range(len(graph.ops))]
        self.position = {op.id: i for i, op in enumerate(graph.ops)}
        prefix = [0.0]
        for t in self.op_time:
            prefix.append(prefix[-1] + t)
        self.prefix = prefix
        self.groups = graph.aliases()

    def _time(self, op_id: int) -> float:
        op = self.graph.ops[op_id]
        if self.cost is None:
            return float(op.flops) * 1e-12 + (0.0 if op.category is OpCategory.VIEW else 1e-6)
        return float(self.cost.op_time(op))

    def transfer(self, nbytes: int) -> float:
        if self.cost is None:
            return nbytes / 12e9 * 2
        cost = self.cost
        return float(cost.transfer_time(nbytes, "d2h") + cost.transfer_time(nbytes, "h2d"))

    def price(self, tid: int, dropped: dict[int, Decision]) -> Choice:
        t = self.graph.tensors[tid]
        producer = self.graph.producer_op(tid)
        recompute = self.op_time[producer.id] + sum(
            self.op_time[self.graph.producer_op(i).id] for i in producer.inputs
            if dropped.get(self.graph.tensors[i].storage) is Decision.RECOMPUTE)
        first_bwd = min((self.position[c] for c in self._readers(tid)
                         if self.graph.ops[c].phase is not Phase.FORWARD), default=None)
        window = 0.0
        if first_bwd is not None:
            window = self.prefix[first_bwd] - self.prefix[self.position[producer.id] + 1]
        exposed = max(0.0, self.transfer(t.nbytes) - window)
        if producer.random or recompute > exposed:
            return Choice(tid, Decision.OFFLOAD, exposed, t.nbytes,
                          f"offload: {t.nbytes} B, transfer {self.transfer(t.nbytes) * 1e3:.3f} ms "
                          f"of which {exposed * 1e3:.3f} ms not hidden by {window * 1e3:.3f} ms "
                          f"of compute; recompute would cost {recompute * 1e3:.3f} ms")
        return Choice(tid, Decision.RECOMPUTE, recompute, t.nbytes,
                      f"recompute {producer.name} ({producer.category}): {recompute * 1e3:.3f} ms, "
                      f"cheaper than {exposed * 1e3:.3f} ms of exposed transfer for {t.nbytes} B")

    def _readers(self, tid: int) -> list[int]:
        return [c for g in self.groups.get(tid, [tid]) for c in self.graph.tensors[g].consumers]


def plan_auto(graph: Graph, budget: int | None, cost: CostModel | None,
              lowerer: Callable[[Graph, Plan], Schedule] = lower) -> tuple[Plan, Schedule]:
    """Return the cheapest plan found whose predicted peak fits ``budget``."""
    plan = Plan(policy="outcore-auto", budget=budget)
    schedule = lowerer(graph, plan)
    movable = set(movable_activations(graph))
    for tid in movable:
        plan.reasons[tid] = "kept: the budget is met without moving it"
    if budget is None:
        return plan, schedule
    pricer = _Pricer(graph, cost)
    best_peak = memory_curve(graph, schedule).peak
    for _ in range(MAX_ROUNDS):
        trace = memory_curve(graph, schedule)
        best_peak = min(best_peak, trace.peak)
        if trace.peak <= budget:
            return plan, schedule
        at = trace.device.index(trace.peak)
        spans = _resident_spans(graph, schedule)
        candidates = [t for t in movable if t not in plan.decisions
                      and any(s <= at < e for s, e in spans.get(t, []))]
        if not candidates:
            if _delay_prefetches(graph, plan, spans, at):
                schedule = lowerer(graph, plan)
                continue
            break
        choices = sorted((pricer.price(t, plan.decisions) for t in candidates),
                         key=lambda c: (c.seconds / max(c.nbytes, 1), -c.nbytes))
        excess = trace.peak - budget
        covered = 0
        for choice in choices:
            plan.decisions[choice.tensor] = choice.decision
            plan.reasons[choice.tensor] = choice.why
            covered += choice.nbytes
            if covered >= excess:
                break
        schedule = lowerer(graph, plan)
    fallback = _fallback(graph, budget, lowerer)
    if fallback is not None:
        return fallback
    lowest = min([best_peak] + [memory_curve(graph, lowerer(graph, p)).peak
                                for p in _fallback_plans(graph, budget)])
    raise InfeasibleBudgetError(
        "outcore-auto", budget, lowest,
        "Every activation resident at the peak is already offloaded or recomputed; raise the "
        "budget, shrink the batch (or let moDNN split it into sub-batches), or use a device "
        "with more memory.")


def _fallback_plans(graph: Graph, budget: int) -> list[Plan]:
    """Offload every activation, prefetching one layer early, then just before use."""
    plans = []
    groups = graph.aliases()
    for delayed in (False, True):
        plan = Plan(policy="outcore-auto", budget=budget)
        for tid in movable_activations(graph):
            plan.decisions[tid] = Decision.OFFLOAD
            plan.reasons[tid] = ("offloaded: the per-tensor search could not meet the budget, "
                                 "so every activation is offloaded"
                                 + ("; prefetched just before its first use" if delayed else ""))
            if delayed:
                readers = [c for a in groups.get(tid, [tid])
                           for c in graph.tensors[a].consumers
                           if graph.ops[c].phase is not Phase.FORWARD]
                if readers:
                    plan.prefetch_at[tid] = min(readers)
        plans.append(plan)
    return plans


def _fallback(graph: Graph, budget: int,
              lowerer: Callable[[Graph, Plan], Schedule]) -> tuple[Plan, Schedule] | None:
    """When the greedy search stalls (recomputes that keep their inputs alive can leave the
    peak on tensors it already decided), fall back to offloading everything, which
    outcore-auto must never do worse than."""
    for plan in _fallback_plans(graph, budget):
        schedule = lowerer(graph, plan)
        if memory_curve(graph, schedule).peak <= budget:
            return plan, schedule
    return None


def _delay_prefetches(graph: Graph, plan: Plan, spans: dict[int, list[tuple[int, int]]],
                      at: int) -> bool:
    """Prefetches resident at the peak are issued just before their first use instead of a
    layer early (trading exposed transfer for memory). True when something changed."""
    changed = False
    for tid, decision in plan.decisions.items():
        if decision is not Decision.OFFLOAD or tid in plan.prefetch_at:
            continue
        if any(s <= at < e for s, e in spans.get(tid, [])[1:]):
            readers = [c for c in graph.tensors[tid].consumers
                       if graph.ops[c].phase is not Phase.FORWARD]
            if readers:
                plan.prefetch_at[tid] = min(readers)
                plan.reasons[tid] += "; prefetched just before its first use to lower the peak"
                changed = True
    return changed


#: Policies whose plans outcore-auto also simulates, keeping the fastest that fits.
PORTFOLIO = ("outcore-optimal", "vdnn-dyn", "superneurons", "modnn", "pooch", "dymem",
             "offload-all")


def _simulated(graph: Graph, schedule: Schedule, cost: CostModel) -> float:
    from outcore.sim import simulate

    return simulate(graph, schedule, cost, verify=False).step_time


def _portfolio(graph: Graph, ctx: PolicyContext, best: PolicyOutput | None) -> PolicyOutput | None:
    """Simulate the seed policies' plans beside our own and keep the fastest that fits."""
    from outcore.errors import OutcoreError
    from outcore.policies.registry import get

    scored: list[tuple[float, str, PolicyOutput]] = []
    if best is not None:
        scored.append((_simulated(best.graph, best.schedule, ctx.cost), "outcore-auto", best))
    for name in PORTFOLIO:
        try:
            out = get(name).fn(graph, ctx)
        except (OutcoreError, ValueError):
            continue  # that policy cannot meet this budget (or is not installed)
        if out.schedule.variants and not ctx.options.get("allow_variants", False):
            # framework kernels only, so gradients stay bit-equal to eager; dropping a
            # variant removes its workspace, so the peak can only go down
            out.schedule = dataclasses.replace(out.schedule, variants={})
            out.plan.variants = {}
        if ctx.budget is not None and memory_curve(out.graph, out.schedule).peak > ctx.budget:
            continue
        scored.append((_simulated(out.graph, out.schedule, ctx.cost), name, out))
    if not scored:
        return None
    _, name, chosen = min(scored, key=lambda item: item[0])
    if name != "outcore-auto":
        ranked = sorted(scored, key=lambda i: i[0])
        others = ", ".join(f"{n} {t * 1e3:.2f} ms" for t, n, _ in ranked)
        for tid in list(chosen.plan.reasons) or list(chosen.plan.decisions):
            chosen.plan.reasons[tid] = (f"{chosen.plan.reasons.get(tid, 'decided')} [outcore-auto "
                                        f"took {name}'s plan: fastest that fits ({others})]")
        chosen.plan.policy = f"outcore-auto ({name})"
    return chosen


@register("outcore-auto", "outcore's hybrid: keep, offload or recompute each activation at the "
          "peak by its cost per byte, until the predicted peak fits the budget; then the "
          "fastest (simulated) of that plan and the seed policies' plans (framework kernels "
          "unless options allow_variants=True)")
def auto_policy(graph: Graph, ctx: PolicyContext) -> PolicyOutput:
    own: PolicyOutput | None = None
    error: InfeasibleBudgetError | None = None
    try:
        plan, schedule = plan_auto(graph, ctx.budget, ctx.cost)
        own = PolicyOutput(plan, schedule, graph)
    except InfeasibleBudgetError as exc:
        error = exc
    if ctx.cost is None or ctx.budget is None or not ctx.options.get("portfolio", True):
        if own is None:
            raise error  # type: ignore[misc]
        return own
    chosen = _portfolio(graph, ctx, own)
    if chosen is None:
        raise error  # type: ignore[misc]
    return chosen
