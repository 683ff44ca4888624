"""moDNN (Chen et al., DATE 2018): memory-optimal DNN training on GPUs, as an outcore policy.

Registered as ``"modnn"``. Given a Graph, a cost model (the "profiling") and a budget M:

1. **TDFG and lower bound.** The Graph is the task and data flow graph: tasks are ops in
   topological order (forward, then backward); data blocks are storages. SW (weights, their
   gradients, the batch, the loss) always stays on the device. Mmin = SW + max_t Mmin(t, 1)
   (eq. 2) on the graph re-captured at sub-batch size 1; a budget below it is refused with
   ``InfeasibleBudgetError`` naming Mmin, its parts and the task that sets it
   (``outcore.policies.modnn.batch``). Every budget >= Mmin is scheduled.
2. **Sub-batch size** by eq. (3), iterated with re-capture ("profiling") at each size; the
   batch is split into ``k = B / b`` equal sub-batches and the executor accumulates their
   gradients (``outcore.runtime.subbatch.run_sub_batches``). ``ctx.recapture(k)`` gives the
   graph at B / k; when it is None the policy refuses to sub-batch and says so.
3. **Algorithm 1** (``outcore.policies.modnn.schedule``): offload when an allocation fails,
   choosing the scheme over the pool's linked list with the least delay, defragmenting
   when no scheme exists; prefetch when eq. (4) says waiting would delay the task; pick each
   convolution's algorithm by the gain of eq. (5) (``outcore.policies.modnn.algos``).

Gradients with sub-batches: for a loss that is a mean over samples and a model without
batch statistics, the accumulated gradient equals the full-batch gradient up to float
rounding (sums in a different order). **BatchNorm** normalises each sub-batch with its own
statistics, so gradients (and the loss) are those of training on the sub-batches, not the
full batch, and running statistics are updated once per sub-batch (k times per step, each
with the module's momentum), exactly as ``run_sub_batches`` does. moDNN's paper does not
discuss batch statistics, so outcore splits such a model only when asked (option
``sub_batch_statistics=True``); otherwise a size below the full batch is unavailable and a
budget that needs one is refused. Which ops couple samples, and along which dimension each
input is split, is proven on the graph (``outcore.graph.batch_dims``): a re-captured graph
that is not the same computation on fewer samples is refused for that size.

Options (``ModnnConfig``): ``batch_size`` and ``batch_dims`` (one dimension per input; by
default inferred from the inputs' shapes, ``outcore.graph.batch_dims``),
``sub_batch_statistics``,
``variants`` (op id -> variant names, or a callable graph -> that table; default: every
variant outcore has for the op). Without a budget the cost model's device memory is used.
A model that cannot run at sub-batch size 1 (BatchNorm needs two samples per channel) gets
its bound at the smallest size it can be captured at.

Not reproduced: moDNN's multi-GPU mode (batch split over GPUs); code generation is outcore's
executor. The remaining choices where the paper is vague are listed in the docstrings of
the three private modules above.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from outcore.errors import InvalidArgumentError
from outcore.graph.batch_dims import graph_batch
from outcore.graph.ir import Graph
from outcore.plan.plan import Decision, Plan
from outcore.plan.schedule import Schedule
from outcore.plan.verify import verify
from outcore.policies.baseline import movable_activations
from outcore.policies.common.context import budget_of as common_budget_of
from outcore.policies.common.context import cost_of
from outcore.policies.modnn.algos import bound, candidates
from outcore.policies.modnn.batch import (
    Footprint,
    Recaptures,
    SubBatchChoice,
    batch_size,
    lower_bound,
    select_sub_batch,
)
from outcore.policies.modnn.config import ModnnConfig
from outcore.policies.modnn.schedule import ModnnScheduler
from outcore.policies.modnn.state import ModnnStats
from outcore.policies.registry import PolicyContext, PolicyOutput, register
from outcore.units import format_bytes

PAPER = "moDNN: Memory Optimal DNN Training on GPUs (Chen, Yang, Li, Chen; DATE 2018)"


@dataclass(kw_only=True)
class ModnnResult(PolicyOutput):
    """moDNN's output (the one result type, ``PolicyOutput``) plus what it decided on the
    way: the sub-batch ``choice`` and the scheduler's ``stats``."""

    choice: SubBatchChoice
    stats: ModnnStats


def budget_of(ctx: PolicyContext) -> int:
    """The budget: ``ctx.budget``, else the cost model's device memory."""
    return common_budget_of(ctx, "moDNN")


def graphs_of(graph: Graph, ctx: PolicyContext) -> Recaptures:
    config = ctx.config_as(ModnnConfig)
    split = ctx.recapture is not None
    # a captured step is split for real, so its layout must be proven; a hand-made graph
    # (no torch source) is only planned, at the batch size its options name
    dims = (graph_batch(graph, config.batch_options()).dims
            if graph.source is not None and split else None)
    return Recaptures(graph, batch_size(graph, config, split=split), ctx.recapture,
                      allow_coupled=config.sub_batch_statistics or ctx.split_changes_ok,
                      split_dims=dims)


def minimum_memory(graph: Graph, ctx: PolicyContext) -> Footprint:
    """Eq. (2) for ``graph``: the footprint at sub-batch size 1 (``.minimum`` is Mmin).

    Needs ``ctx.recapture`` unless the batch size is already 1.
    """
    graphs = graphs_of(graph, ctx)
    if graphs.batch != 1 and ctx.recapture is None:
        raise InvalidArgumentError(None, "a context whose recapture captures the step at "
                                   "batch 1", "Mmin is defined at sub-batch size 1.")
    return lower_bound(graphs, _cost(ctx), ctx.config_as(ModnnConfig))


def sub_batch(graph: Graph, ctx: PolicyContext) -> SubBatchChoice:
    """moDNN's sub-batch size for ``ctx.budget`` (eq. 3), reusable by other policies (vDNN+)."""
    return select_sub_batch(graphs_of(graph, ctx), budget_of(ctx), _cost(ctx),
                            ctx.config_as(ModnnConfig))


def _cost(ctx: PolicyContext) -> Any:
    return cost_of(ctx, "moDNN")


def plan_modnn(graph: Graph, ctx: PolicyContext) -> ModnnResult:
    """Run moDNN: its output (on the sub-batch graph when it splits) with the sub-batch
    choice and statistics."""
    budget = budget_of(ctx)
    cost = _cost(ctx)
    config = ctx.config_as(ModnnConfig)
    choice = select_sub_batch(graphs_of(graph, ctx), budget, cost, config)
    g = choice.graph
    scheduler = ModnnScheduler(g, bound(g, cost), budget - choice.footprint.sw,
                               candidates(g, cost, config), reserved=choice.footprint.sw)
    stats = scheduler.run()
    schedule = Schedule(instructions=scheduler.slots.instructions(), keep_at_end=list(g.outputs),
                        variants=dict(sorted(scheduler.variants.items())),
                        sub_batches=choice.parts, policy="modnn")
    verify(g, schedule)
    plan = _plan(g, scheduler, choice, budget)
    return ModnnResult(plan, schedule, g, choice=choice, stats=stats)


def _plan(graph: Graph, scheduler: ModnnScheduler, choice: SubBatchChoice, budget: int) -> Plan:
    """The decisions Algorithm 1 took, per activation, with the reason."""
    plan = Plan(policy="modnn", variants=dict(scheduler.variants), sub_batches=choice.parts,
                budget=budget)
    order = scheduler.order
    for tid in movable_activations(graph):
        at = scheduler.first_eviction.get(tid)
        size = format_bytes(graph.tensors[tid].nbytes)
        if at is None:
            plan.reasons[tid] = f"kept: every allocation succeeded while it was live ({size})"
            continue
        plan.decisions[tid] = Decision.OFFLOAD
        plan.reasons[tid] = (f"offloaded ({size}) when task {graph.ops[order[at]].name!r} could "
                             "not allocate; the scheme with the least delay held it")
    return plan


@register("modnn", "moDNN: sub-batches by eq. 3, offload on allocation failure, prefetch by "
          "eq. 4, convolution algorithms by gain (eq. 5)", PAPER, ModnnConfig)
def modnn(graph: Graph, ctx: PolicyContext) -> PolicyOutput:
    """moDNN for ``ctx.budget`` (see the module docstring)."""
    return plan_modnn(graph, ctx)
