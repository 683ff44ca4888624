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

Option ``monotone=True`` plans on a ladder (``outcore.policies.auto_ladder``) so that the
planned peak never rises as the budget falls; without it, the fastest plan that fits may
have a higher peak at a smaller budget.

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
from outcore.plan.memory import MemoryTrace, memory_curve
from outcore.plan.plan import Decision, Plan
from outcore.plan.residency import resident_spans
from outcore.plan.schedule import Schedule
from outcore.policies.auto.config import AutoConfig
from outcore.policies.auto.portfolio import (
    CANDIDATES,
    HOST_SPARING,
    SHARED_MEMORY,
    crowned,
    run_portfolio,
)
from outcore.policies.baseline import movable_activations
from outcore.policies.registry import PolicyContext, PolicyOutput, register

MAX_ROUNDS = 10_000

#: outcore-auto's note when, where host and device memory are one memory, only plans with
#: host copies fit: it describes the schedule on this machine (a carried plan keeps it).
HOST_COPIES_NOTE = ("outcore-auto: no plan without host copies fits; host and device memory "
                    "are one memory here, so the host copies below free no RAM, they only "
                    "keep the device's budget")


@dataclass(frozen=True)
class Choice:
    """The cheaper way to drop one activation at the peak, and what it costs."""

    tensor: int
    decision: Decision
    seconds: float
    nbytes: int
    why: str


def shared_memory(cost: object) -> bool:
    """Whether ``cost`` prices a device whose memory is the host's (``HardwareProfile.
    shared_memory``: this CPU), where an offload frees nothing."""
    return bool(getattr(getattr(cost, "profile", None), "shared_memory", False))


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
        self.shared_memory = shared_memory(cost)

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
        if self.shared_memory:  # an offload frees nothing: recompute (RNG replayed if random)
            return Choice(tid, Decision.RECOMPUTE, recompute, t.nbytes,
                          f"recompute {producer.name} ({producer.category}): "
                          f"{recompute * 1e3:.3f} ms; host and device memory are one memory, "
                          "so an offload would free nothing")
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
    # ``trace`` is the memory rule's trace of ``schedule``, replayed once per new schedule
    first = memory_curve(graph, schedule)
    trace: MemoryTrace | None = first
    best_peak = first.peak
    for _ in range(MAX_ROUNDS):
        if trace is None:
            trace = memory_curve(graph, schedule)
        best_peak = min(best_peak, trace.peak)
        if trace.peak <= budget:
            return plan, schedule
        at = trace.device.index(trace.peak)
        spans = resident_spans(graph, schedule)
        candidates = [t for t in movable if t not in plan.decisions
                      and any(s <= at < e for s, e in spans.get(t, []))]
        if not candidates:
            if _delay_prefetches(graph, plan, spans, at):
                schedule, trace = lowerer(graph, plan), None
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
        schedule, trace = lowerer(graph, plan), None
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


def greedy_policy(graph: Graph, ctx: PolicyContext) -> PolicyOutput:
    """outcore's own greedy planner (``plan_auto``) as a portfolio candidate (run once per
    portfolio run: outcore-optimal's warm start reads the same plan, ``memo``), with release
    points where its copy-outs stall the forward and that is faster (``release``; its
    simulation on ``ctx.cost``, and its memory trace where it was computed, travel in the
    output, so the portfolio does not replay them)."""
    from outcore.policies.auto.memo import shared_greedy
    from outcore.policies.auto.release import released

    plan, schedule = shared_greedy(graph, ctx.budget, ctx.cost)
    if ctx.budget is not None and ctx.cost is not None and plan.decisions:
        out = released(graph, plan, schedule, ctx.budget, ctx.cost)
        return PolicyOutput(out.plan, out.schedule, graph, simulation=out.simulation,
                            trace=out.trace)
    return PolicyOutput(plan, schedule, graph)


@register("outcore-auto", "outcore's hybrid: keep, offload or recompute each activation at the "
          "peak by its cost per byte, until the predicted peak fits the budget; then the "
          "fastest (simulated) of that plan and the portfolio's candidates' plans (framework "
          "kernels unless options allow_variants=True)", config=AutoConfig)
def auto_policy(graph: Graph, ctx: PolicyContext) -> PolicyOutput:
    """The portfolio (``outcore.policies.auto.portfolio``) when there is a budget and a cost
    model to simulate with, else the greedy planner alone; ``monotone=True`` plans on the
    ladder of ``outcore.policies.auto_ladder`` (the peak never rises as the budget falls)."""
    config = ctx.config_as(AutoConfig)
    if config.monotone:
        from outcore.policies.auto_ladder import monotone_plan

        return monotone_plan(graph, ctx, auto_policy)
    if ctx.cost is None or ctx.budget is None or not config.portfolio:
        return greedy_policy(graph, ctx)  # a host budget it breaks: outcore.plan says so
    runners = {"outcore-auto": greedy_policy}
    parallel = None if config.parallel else False  # None: by the machine and the graph
    notes: list[str] = []
    if shared_memory(ctx.cost):
        # host and device memory are one memory: an offload frees nothing, so plans that
        # hold no host copy are tried first (outcore.cost.profiles.HardwareProfile)
        sparing = run_portfolio(graph, dataclasses.replace(ctx, host_budget=0),
                                SHARED_MEMORY + HOST_SPARING, runners,
                                allow_variants=config.allow_variants, parallel=parallel)
        if sparing.winner is not None:
            return crowned(sparing, ctx.budget)
        notes.append(HOST_COPIES_NOTE)
    candidates = CANDIDATES + (HOST_SPARING if ctx.host_budget is not None else ())
    result = run_portfolio(graph, ctx, candidates, runners,
                           allow_variants=config.allow_variants, parallel=parallel)
    out = crowned(result, ctx.budget)
    return dataclasses.replace(out, notes=notes + list(out.notes)) if notes else out
