"""Dymem (Yang & Cheng, HPDC 2020): memory management for nonlinear DNNs, as an outcore policy.

Registered as ``"dymem"``:

1. **Execution order** (§3.1, Alg. 1): depth-first over the fork/join graph, so one branch
   runs to its join before the next starts (``outcore.graph.order.execution_order(graph,
   "dfs")``), forward then backward.
2. **Offload without per-layer barriers** (§3.2.1): every offload candidate
   (``outcore.policies.dymem.prefetch``) is copied out as soon as its producer ends; the
   next layer starts at once, and the map is released when its copy has ended and its
   forward readers are done. Forward is blocked only when memory would overflow; at the
   end of forward all copies are waited for (the paper's synchronisation of both streams).
3. **Prefetch** (§3.2.2, Alg. 2): issued by the candidate search (up to two CONV layers
   ahead), delayed while memory does not allow; compute waits only for its own inputs.
4. **Placement** (§3.3, Alg. 3): tensors grouped by mobility (movable, temporary,
   reclaimed) in the unified pool (low end, high end, incremental space), with the pool
   squeeze ``mem_size = (init - squeeze_gap) + beta``: ``place(graph, schedule)`` runs
   ``outcore.pool.gtbm_placement`` on the schedule's blocks (``outcore.pool``).

The budget, when given, bounds the device bytes (the memory rule of ``outcore.plan.memory``,
what the executor measures); the GTBM pool size is reported by ``place`` (Dymem's "maximum
allocated GPU memory", Fig. 12) and is at least that. A budget the offload-everything
schedule cannot meet even with every prefetch just in time raises ``InfeasibleBudgetError``.

Options (``DymemConfig``): ``features`` overrides the feature-map list (default: activations at
least 1/1024 of the largest, as for PoocH). Without a budget nothing bounds the device bytes.

Choices: convolution algorithms are left to the framework kernel (the paper's Dymem(m),
its configuration for the overlap study of Fig. 14; §4.2's dynamic workspace growth is not
reproduced); recomputation is not used (the paper does not use it either); small saved
tensors (batch-norm statistics) are kept like the reclaimed group.
"""

from __future__ import annotations

from dataclasses import dataclass

from outcore.errors import InfeasibleBudgetError
from outcore.graph.ir import Graph
from outcore.graph.order import execution_order
from outcore.plan.memory import predicted_peak
from outcore.plan.plan import Decision, Plan
from outcore.plan.schedule import Schedule
from outcore.plan.verify import verify
from outcore.policies.common.context import cost_of
from outcore.policies.common.timeline import (
    KEEP,
    SWAP,
    Evaluation,
    FeatureClass,
    Profile,
    evaluate,
    producer,
)
from outcore.policies.dymem.config import DymemConfig
from outcore.policies.dymem.prefetch import alg2_rule, offload_candidates
from outcore.policies.pooch import build_schedule, just_in_time
from outcore.policies.registry import PolicyContext, PolicyOutput, register
from outcore.pool import Placement, blocks_from_schedule, gtbm_placement
from outcore.pool import place as place_blocks
from outcore.units import format_bytes

PAPER = "Efficient GPU Memory Management for Nonlinear DNNs (Yang & Cheng; HPDC 2020)"

#: Dymem's reserved space against fluctuation (§5.5 finds 300 MB best).
DEFAULT_BETA = 300 * 10**6


@dataclass(kw_only=True)
class DymemResult(PolicyOutput):
    """Dymem's output (the one result type, ``PolicyOutput``; ``predicted_peak`` filled) and
    the simulated timeline behind it."""

    evaluation: Evaluation
    profile: Profile


def plan_dymem(graph: Graph, ctx: PolicyContext) -> DymemResult:
    """Run Dymem (see the module docstring)."""
    cost = cost_of(ctx, "Dymem")
    order = execution_order(graph, "dfs")
    profile = Profile(graph, order, cost, ctx.config_as(DymemConfig).features)
    moved = set(offload_candidates(profile))
    classes = {x: (SWAP if x in moved else KEEP) for x in profile.features}
    budget = float("inf") if ctx.budget is None else float(ctx.budget)
    ev = evaluate(profile, classes, budget, swap_in_at=alg2_rule(profile), sync_forward=True)
    if not ev.feasible:
        need = all_swap_minimum_for(profile, classes)
        raise InfeasibleBudgetError(
            "dymem", int(budget), int(need),
            f"Offloading every candidate feature map ({len(moved)}), forward blocked on each "
            f"copy-out and every prefetch just in time, the step still needs "
            f"{format_bytes(need)}. Raise the budget or reduce the batch.")
    schedule = build_schedule(graph, profile.order, ev.classes, ev.free_at, ev.issue_at,
                              ev.need_at, policy="dymem")
    verify(graph, schedule)
    peak = predicted_peak(graph, schedule)
    if ctx.budget is not None and peak > ctx.budget:
        raise InfeasibleBudgetError("dymem", int(ctx.budget), peak,
                                    "The offload schedule's peak exceeds the budget; raise it.")
    return DymemResult(_plan(graph, profile, ev, ctx.budget), schedule, graph,
                       predicted_peak=peak, evaluation=ev, profile=profile)


def all_swap_minimum_for(profile: Profile, classes: dict[int, FeatureClass]) -> float:
    """The least peak of ``classes`` (copy-outs waited at once, prefetches just in time)."""
    return evaluate(profile, classes, 0.0, swap_in_at=just_in_time, strict=False).peak


def _plan(graph: Graph, profile: Profile, ev: Evaluation, budget: int | None) -> Plan:
    plan = Plan(policy="dymem", budget=budget)
    for x in profile.features:
        size = format_bytes(profile.size[x])
        op = graph.ops[producer(graph, x)]
        if ev.classes[x] == SWAP:
            plan.decisions[x] = Decision.OFFLOAD
            plan.prefetch_at[x] = profile.order[ev.issue_at[x]]
            plan.reasons[x] = (f"offloaded ({size}, {op.category} output); prefetched "
                               f"{ev.need_at[x] - ev.issue_at[x]} ops before its use (Alg. 2)")
        else:
            plan.reasons[x] = (f"kept ({size}, {op.category} output): reclaimed group, or its "
                               "copy-out would outlast its stay on the device")
    return plan


def place(graph: Graph, schedule: Schedule, beta: int = DEFAULT_BETA,
          policy: str = "gtbm") -> Placement:
    """Place the schedule's tensors in one pool: Dymem's GTBM with the squeeze and ``beta``
    (default), or any ``outcore.pool`` policy by name (e.g. "best-fit", vDNN's CNMeM)."""
    blocks = blocks_from_schedule(graph, schedule)
    if policy == "gtbm":
        return gtbm_placement(blocks, beta=beta)
    return place_blocks(blocks, policy)


@register("dymem", "Dymem: DFS order, offload/prefetch without per-layer barriers, prefetch "
          "candidate search (Alg. 2); GTBM pool placement via dymem.place", PAPER, DymemConfig)
def dymem(graph: Graph, ctx: PolicyContext) -> PolicyOutput:
    """Dymem (see the module docstring)."""
    return plan_dymem(graph, ctx)
