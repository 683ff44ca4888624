"""SuperNeurons (Wang et al., PPoPP 2018) as an outcore policy: ``superneurons``.

The runtime's techniques, in the order the paper stacks them (Sec. 3), and where each lives:

* **Execution route** (Alg. 1): ``outcore.graph.order.execution_order(graph, "superneurons")``.
* **Liveness analysis** (Sec. 3.2): every tensor is freed right after its last reader
  (``superneurons.sequence``).
* **Cost-aware recomputation** (Sec. 3.4): forward results of non-checkpoint layers are
  dropped and recomputed in backward from the checkpoints (CONV, FC), speed-centric or
  memory-centric per segment against ``l_peak = max_i l_i`` (``superneurons.segments``).
* **Unified tensor pool** (Sec. 3.3): CONV checkpoint tensors are offloaded to host memory and
  prefetched back, through an LRU tensor cache that moves data only when device memory is
  insufficient (Alg. 2), or eagerly without the cache (``superneurons.utp``).
* **Convolution workspace** (Sec. 3.5): once the schedule is fixed, each op with variant
  candidates gets the fastest one whose workspace fits the bytes free at its step
  (``outcore.variants.select.superneurons_fastest_fit``; candidates as in
  ``common.variants``). Without a budget every op gets its fastest variant.

The memory pool with 1 KB blocks (Sec. 3.2.1) is a placement concern, outside a policy.

Options (``SuperNeuronsConfig``):

* ``recompute``: a ``Recompute``: "cost-aware" (default), "speed", "memory" or "none" (its
  string reads the same, as ``--option recompute=speed`` gives it);
* ``offload``: offload CONV checkpoints through the tensor pool (default True);
* ``tensor_cache``: use the LRU tensor cache (default True); False offloads every checkpoint
  as soon as it is made, as Fig. 10b and Table 3's "without Tensor Cache" measure;
* ``variants``: op id -> supported variant names (see ``common.variants``).

A budget the runtime cannot meet (a step that does not fit even after offloading every
unlocked tensor) raises ``InfeasibleBudgetError`` at planning time, naming the least budget
with which this policy's schedule can be built.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from outcore.errors import InfeasibleBudgetError
from outcore.graph.ir import Graph, OpCategory, TensorKind
from outcore.graph.order import execution_order
from outcore.plan.memory import predicted_peak
from outcore.plan.plan import Decision, Plan
from outcore.plan.schedule import Offload, Schedule
from outcore.plan.verify import verify
from outcore.policies.common.variant_spec import variant_table
from outcore.policies.common.variants import (
    candidates,
    choice_by_op,
    peak_with,
    steps,
    with_variants,
)
from outcore.policies.registry import PolicyContext, PolicyOutput, register
from outcore.policies.superneurons.config import Recompute, SuperNeuronsConfig
from outcore.policies.superneurons.segments import Segmentation, segment
from outcore.policies.superneurons.sequence import compute_sequence
from outcore.policies.superneurons.utp import NoRoom, UtpStats, apply_pool
from outcore.units import format_bytes
from outcore.variants import select

PAPER = "SuperNeurons (Wang et al., PPoPP 2018)"
NAME = "superneurons"


@dataclass(kw_only=True)
class SuperNeuronsResult(PolicyOutput):
    """SuperNeurons' output (the one result type, ``PolicyOutput``) and what the runtime did.

    ``peak``: peak bytes with the chosen workspace as the context's cost model prices it
    (``outcore.plan`` recomputes ``predicted_peak`` with the workspace capture recorded);
    ``recomputations``: recomputed non-view ops (Table 1's "extra"); ``stats``: the tensor
    pool's copies and cache hits; ``segmentation``: checkpoints and segments.
    """

    segmentation: Segmentation
    stats: UtpStats
    peak: int
    recomputations: int


def _build(graph: Graph, order: Sequence[int], seg: Segmentation, offload: bool, cache: bool,
           budget: int | None) -> tuple[list[Any], UtpStats]:
    seq = compute_sequence(graph, order, seg)
    return apply_pool(graph, seq, seg.offloadable if offload else set(), budget, cache)


def least_budget(graph: Graph, *, recompute: Recompute | str = Recompute.COST_AWARE,
                 offload: bool = True, cache: bool = True) -> int:
    """The least budget (to 1/1000) under which this policy can plan ``graph``.

    No budget can be below the static bytes plus the largest op (``l_peak``), so the search
    starts there (see ``_least_budget``).
    """
    order = execution_order(graph, "superneurons")
    seg = segment(graph, order, recompute)
    return _least_budget(graph, order, seg, offload, cache, graph.static_bytes() + seg.l_peak)


def _least_budget(graph: Graph, order: Sequence[int], seg: Segmentation, offload: bool,
                  cache: bool, lower_bound: int) -> int:
    """Search for the least budget the tensor pool can build a schedule under.

    ``lower_bound - 1`` is known to fail (a budget that failed, or the bytes a failing step
    needs beyond every evictable tensor). The search first tries the peak of eager
    offloading, then doubles its step until a build succeeds, then bisects to 1/1000. A
    build without a budget always succeeds, which bounds the search.
    """

    def builds(budget: int) -> bool:
        try:
            _build(graph, order, seg, offload, cache, budget)
            return True
        except NoRoom:
            return False

    ceiling = _peak_of(graph, order, seg, offload, cache, None)
    lo = lower_bound - 1
    hi = min(ceiling, max(lower_bound, _peak_of(graph, order, seg, offload, False, None)))
    step = max(1, hi - lo)
    while hi < ceiling and not builds(hi):
        lo, hi, step = hi, min(ceiling, hi + step), step * 2
    while hi - lo > max(1, hi // 1000):
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if builds(mid) else (mid, hi)
    return hi


def _peak_of(graph: Graph, order: Sequence[int], seg: Segmentation, offload: bool, cache: bool,
             budget: int | None) -> int:
    instructions, _ = _build(graph, order, seg, offload, cache, budget)
    return predicted_peak(graph, _schedule(graph, instructions, NAME))


def _schedule(graph: Graph, instructions: list[Any], name: str) -> Schedule:
    return Schedule(instructions=instructions, keep_at_end=list(graph.outputs), policy=name)


def plan_superneurons(graph: Graph, ctx: PolicyContext, *, name: str = NAME
                      ) -> SuperNeuronsResult:
    """Plan one training step the SuperNeurons way (module docstring) for ``ctx``: its budget,
    cost model and ``SuperNeuronsConfig`` (recompute, offload, tensor_cache, variants).

    Raises InfeasibleBudgetError when no step sequence of this policy fits ``ctx.budget``.
    """
    config = ctx.config_as(SuperNeuronsConfig)
    budget, recompute, offload = ctx.budget, config.recompute, config.offload
    cache = config.tensor_cache
    order = execution_order(graph, "superneurons")
    seg = segment(graph, order, recompute)
    try:
        instructions, stats = _build(graph, order, seg, offload, cache, budget)
    except NoRoom as exc:
        assert budget is not None
        need = _least_budget(graph, order, seg, offload, cache, max(exc.wanted, budget + 1))
        raise InfeasibleBudgetError(
            name, budget, need,
            f"At {format_bytes(budget)}, {exc.what} does not fit even after offloading every "
            "unlocked checkpoint. Raise the budget, reduce the batch, or enable offload / "
            "recomputation.") from None
    schedule = _schedule(graph, instructions, name)
    verify(graph, schedule)
    table = candidates(graph, ctx.cost, variant_table(graph, config.variants))
    rows = steps(graph, schedule, table)
    limit = budget if budget is not None else max(
        (r.live_bytes + max((c.workspace_bytes for c in r.candidates), default=0) for r in rows),
        default=0)
    choice = choice_by_op(select.superneurons_fastest_fit(rows, limit))
    plan = _explain(graph, seg, schedule, name, offload, cache, recompute)
    plan.variants = dict(choice)
    plan.budget = budget
    recomputed = sum(1 for o in schedule.recomputed_ops()
                     if graph.ops[o].category is not OpCategory.VIEW)
    return SuperNeuronsResult(plan, with_variants(schedule, choice), graph, segmentation=seg,
                              stats=stats, peak=peak_with(graph, schedule, table, choice),
                              recomputations=recomputed)


def _explain(graph: Graph, seg: Segmentation, schedule: Schedule, name: str, offload: bool,
             cache: bool, recompute: Recompute) -> Plan:
    """Decisions and one-line reasons for every activation backward reads."""
    offloaded = {ins.tensor for ins in schedule.instructions if isinstance(ins, Offload)}
    plan = Plan(policy=name)
    pool = "eagerly" if not cache else "by the LRU tensor cache when memory ran short"
    for t in graph.activations():
        if t.kind is TensorKind.OUTPUT:
            continue
        size = format_bytes(t.nbytes)
        if t.id in offloaded:
            plan.decisions[t.id] = Decision.OFFLOAD
            plan.reasons[t.id] = f"checkpoint ({size}) offloaded {pool}; prefetched for backward"
        elif t.id in seg.dropped:
            plan.decisions[t.id] = Decision.RECOMPUTE
            how = seg.strategy_of_storage(graph, t.id)
            plan.reasons[t.id] = (f"non-checkpoint layer output ({size}) dropped; recomputed "
                                  f"{how}-centric (l_peak {format_bytes(seg.l_peak)})")
        elif t.id in seg.checkpoints:
            where = "offloadable, stayed cached" if t.id in seg.offloadable and offload else "kept"
            plan.reasons[t.id] = f"checkpoint ({size}) {where}"
        else:
            plan.reasons[t.id] = f"kept ({size}); freed after its last use"
    return plan


@register(NAME, "SuperNeurons: execution route, liveness, cost-aware recomputation, CONV "
          "offload through an LRU tensor cache, per-step convolution workspace; options "
          "recompute=cost-aware|speed|memory|none, offload, tensor_cache", PAPER,
          SuperNeuronsConfig)
def superneurons_policy(graph: Graph, ctx: PolicyContext) -> PolicyOutput:
    return plan_superneurons(graph, ctx)
