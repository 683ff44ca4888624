"""outcore-checkpoint: recompute-only plans with recompute chains of any depth (segments).

Activation checkpointing keeps a block's input and rebuilds everything inside the block
from it in backward. This planner does that on the Graph, without module boundaries:

1. **Cuts.** A forward position is a cut when exactly one non-static base tensor produced
   at or before it is still read by a later forward op (the residual stream between two
   blocks, the output of a plain layer in a chain), not counting *long-lived* tensors:
   those read across more than ``LONG_LIVED`` of the forward (an attention mask built once
   and read by every layer, as Hugging Face models do; a U-Net's outer skip). A cut keeps
   every tensor crossing it, long-lived ones included, as checkpointing keeps every input
   of a block (the hidden state and the mask). Keeping the cut tensors and recomputing
   every other forward intermediate is checkpointing with one segment per cut; keeping every
   ``s``-th cut (from offset 0, 1 or 2) makes longer segments.
2. **Recompute everything else.** Every forward intermediate that is not kept is
   RECOMPUTE, including those backward never reads (``outcore.plan.lower`` then rebuilds
   them inside the chain instead of keeping them alive from forward to backward). The
   lowering rebuilds a tensor recursively from its producer's inputs back to kept tensors
   (a chain of any depth), once per step; random ops (dropout) replay their forward RNG
   state when recomputed (``outcore.runtime.executor``), so gradients stay bit-equal.
3. **Keep back what fits.** From the fastest segment plan that fits the budget, activations
   backward reads are kept again one by one, most recompute time per byte first (matmul,
   convolution and attention outputs before element-wise ones, as selective checkpointing
   saves them), whenever the peak still fits: the plan uses the memory it is given
   (``outcore.policies.auto.keepback``, which rejects most trials without lowering them).

Peaks are the memory rule's (``plan.memory``), so the plan's predicted peak is what the
executor measures. A budget below every segment plan's peak raises InfeasibleBudgetError
with the lowest peak seen. The plan never offloads (it suits devices whose host memory is
their own memory, and host budgets of zero).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from outcore.cost.model import CostModel
from outcore.errors import InfeasibleBudgetError
from outcore.graph.ir import STATIC_KINDS, Graph, Phase
from outcore.plan.lower import forward_intermediates, lower
from outcore.plan.memory import memory_curve
from outcore.plan.plan import Decision, Plan
from outcore.plan.schedule import Schedule
from outcore.policies.auto.keepback import keep_back
from outcore.policies.baseline import movable_activations
from outcore.policies.config import PolicyConfig
from outcore.policies.registry import PolicyContext, PolicyOutput, register

NAME = "outcore-checkpoint"
#: Segment strides tried (keep every s-th cut).
STRIDES = (1, 2, 3, 4, 6, 8)
#: Offsets tried per stride (where the first segment boundary falls).
MAX_OFFSETS = 3
#: A tensor read across more than this share of the forward's positions (and more than
#: ``LONG_LIVED_MIN`` of them) is long-lived: it does not stop a position from being a cut.
LONG_LIVED = 0.25
LONG_LIVED_MIN = 16


@dataclass(frozen=True)
class Cut:
    """A forward position (index among forward ops) where only ``storage`` crosses, besides
    the long-lived tensors ``also`` (kept with it); ``nbytes`` counts ``storage`` alone."""

    position: int
    storage: int
    nbytes: int
    also: tuple[int, ...] = ()

    @property
    def storages(self) -> tuple[int, ...]:
        """Every storage a segment boundary here keeps."""
        return (self.storage, *self.also)


def find_cuts(graph: Graph) -> list[Cut]:
    """The cuts of ``graph``'s forward (module docstring), in forward order, one per storage
    (the first position it is the only crossing tensor)."""
    forward = [op for op in graph.ops if op.phase is Phase.FORWARD]
    position = {op.id: i for i, op in enumerate(forward)}
    last: dict[int, int] = {}
    born: dict[int, int] = {}
    for i, op in enumerate(forward):
        for out in op.outputs:
            t = graph.tensors[out]
            if t.kind not in STATIC_KINDS:
                born.setdefault(t.storage, i)
        for inp in op.inputs:
            s = graph.tensors[inp].storage
            if s in born:
                last[s] = max(last.get(s, -1), position[op.id])
    # sweep: +1 at birth, -1 after the last forward read; a cut when exactly one is open
    opens: dict[int, list[int]] = {}
    closes: dict[int, list[int]] = {}
    for s, b in born.items():
        end = last.get(s, b)
        if end > b:
            opens.setdefault(b, []).append(s)
            closes.setdefault(end, []).append(s)
    long_lived = _long_lived(born, last, len(forward))
    live: set[int] = set()
    cuts: list[Cut] = []
    seen: set[int] = set()
    for i in range(len(forward)):
        live.update(opens.get(i, ()))
        live.difference_update(closes.get(i, ()))
        local = live - long_lived
        if len(live) == 1 or len(local) == 1:
            (s,) = live if len(live) == 1 else local
            if s not in seen:
                seen.add(s)
                cuts.append(Cut(i, s, graph.tensors[s].nbytes, tuple(sorted(live - {s}))))
    return cuts


def _long_lived(born: dict[int, int], last: dict[int, int], positions: int) -> set[int]:
    """Storages read across more than ``LONG_LIVED`` of ``positions`` forward positions."""
    least = max(LONG_LIVED_MIN, LONG_LIVED * positions)
    return {s for s, b in born.items() if last.get(s, b) - b > least}


def segment_plan(graph: Graph, keep: Iterable[int], budget: int | None = None) -> Plan:
    """Recompute every forward intermediate except ``keep`` (storage ids)."""
    kept = set(keep)
    plan = Plan(policy=NAME, budget=budget)
    for tid in sorted(forward_intermediates(graph) - kept):
        plan.decisions[tid] = Decision.RECOMPUTE
        plan.reasons[tid] = "recomputed from the nearest kept tensors (checkpoint segment)"
    for tid in kept:
        plan.reasons[tid] = "kept: a segment boundary (a tensor crossing this point)"
    return plan


def plan_checkpoint(graph: Graph, budget: int | None, cost: CostModel | None,
                    lowerer: Callable[[Graph, Plan], Schedule] = lower
                    ) -> tuple[Plan, Schedule]:
    """The fastest-looking recompute-only plan that fits ``budget`` (module docstring)."""
    full = Plan(policy=NAME, budget=budget)
    schedule = lowerer(graph, full)
    if budget is None or memory_curve(graph, schedule).peak <= budget:
        for tid in movable_activations(graph):
            full.reasons[tid] = "kept: the budget holds without recomputing anything"
        return full, schedule
    cuts = find_cuts(graph)
    best: tuple[int, Plan, Schedule] | None = None
    lowest = memory_curve(graph, schedule).peak
    layouts = [(stride, offset) for stride in STRIDES if stride == 1 or stride < len(cuts)
               for offset in range(min(stride, MAX_OFFSETS))]
    for stride, offset in layouts:
        plan = segment_plan(graph, [s for c in cuts[offset::stride] for s in c.storages],
                            budget)
        sched = lowerer(graph, plan)
        peak = memory_curve(graph, sched).peak
        lowest = min(lowest, peak)
        if peak <= budget:
            recomputes = sum(1 for d in plan.decisions.values() if d is Decision.RECOMPUTE)
            if best is None or recomputes < best[0]:
                best = (recomputes, plan, sched)
    if best is None:
        raise InfeasibleBudgetError(
            NAME, budget, lowest,
            "Even recomputing every activation from its segment's input does not fit; raise "
            "the budget, let outcore-auto offload, or split the batch (modnn).")
    _, plan, sched = best
    return keep_back(graph, plan, sched, budget, cost, lowerer)


@register(NAME, "recompute-only checkpoint segments found on the graph (the only tensor "
          "crossing a point is kept, everything else rebuilt from it by chains of any depth, "
          "dropout replayed bit-exact), then the most expensive recomputes kept back while "
          "the budget holds; never offloads")
def checkpoint_policy(graph: Graph, ctx: PolicyContext) -> PolicyOutput:
    from outcore.policies.auto.memo import shared_checkpoint

    ctx.config_as(PolicyConfig)  # no options
    plan, schedule = shared_checkpoint(graph, ctx.budget, ctx.cost)  # once per portfolio
    return PolicyOutput(plan, schedule, graph)
