"""vDNN (Rhu et al., MICRO 2016) as outcore policies: vDNN-all, vDNN-conv, vDNN-dyn and the
paper's baseline.

What the paper does, and how it maps onto outcore's ATen-level graph:

* **Release** (Sec. III-A): a feature map is released once the layer being processed is its
  last consumer; gradients once their layer's backward is done. This is outcore's
  free-at-last-use lowering (``outcore.plan.lower``).
* **Layers and their X.** A layer is a forward op that is not a view (conv, matmul, pool,
  norm, dropout, element-wise, loss); its input feature map X is the base storage of an
  activation it reads. The paper's ReLU runs in place and its X is never offloaded; in
  outcore's graph ReLU is out of place, but its input (the conv output) is not read in
  backward, so it is never a candidate either: only activations backward reads (the
  graph's ``activations()``) can be offloaded. The image batch is a graph input owned by
  the caller and stays resident (the paper offloads conv1's X too).
* **vDNN-all** offloads the X of every layer. In the ATen graph every activation backward
  reads is some layer's X or state a layer keeps for its own backward (max-pool indices,
  dropout masks, batch-norm statistics: cuDNN's layers keep X and Y instead), so vDNN-all
  offloads every movable activation; what sets it apart from ``offload-all`` is the prefetch
  rule and the per-layer synchronisation below.
* **vDNN-conv** offloads only the X of CONV layers (the activation inputs of every forward
  convolution).
* **Offload** (Sec. III-B): launched on the memory stream while the consuming layer
  computes; the compute stream synchronises at the end of the last consuming layer, and
  the X is released. The lowering starts each offload right after the producer (the same
  point for a chain; earlier for a fork) and puts ``Wait(d2h)`` + ``Free`` after the last
  forward reader.
* **Prefetch** (Fig. 10): ``outcore.policies.vdnn.prefetch`` (the window reaches up to the
  next CONV layer; one prefetch per layer; the stream synchronises before the next layer).
* **Algorithms** ("(m)" / "(p)", Sec. III-C): memory-optimal = every op on its least-workspace
  variant (the framework kernel, implicit GEMM's role), performance-optimal = every op on its
  fastest variant; see ``outcore.policies.common.variants``. The static policies read the
  ``algo`` option (``VdnnStaticConfig``: "m" or "p", default "p": the fastest algorithms,
  what a framework runs by default and what the paper's baseline and power study use);
  ``vdnn-all-m`` etc. fix it in the name.
* **vDNN-dyn** (Sec. III-C): the profiling passes in the paper's order, run against the
  predicted memory of each configuration (a "training pass" passes when every step fits the
  budget): vDNN-all(m) must pass, else the network is untrainable; then no offloading with
  the fastest algorithms, then vDNN-conv, then vDNN-all, both fastest; then the greedy
  per-layer downgrade on vDNN-conv, then on vDNN-all; finally vDNN-all(m)
  (``outcore.variants.select.vdnn_dyn``). Without a budget the first fastest pass fits.
* **Baseline** (Sec. IV-A): Torch's network-wide allocation: every forward feature map stays
  allocated for the whole step, gradient maps are reused (freed after their last use); a conv
  output that only feeds an in-place activation is one buffer with it (``common.layers``).
  Registered as ``vdnn-base``; its time with the fastest algorithms and no capacity limit is
  the paper's oracular baseline.

A static policy, or the baseline, whose predicted peak (workspace included) exceeds the budget
raises ``InfeasibleBudgetError`` naming it, the budget and its peak, before anything runs:
the paper marks those configurations as failing (*).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from outcore.errors import InfeasibleBudgetError, PolicyOptionError
from outcore.graph.ir import Graph, OpCategory, Phase, TensorKind
from outcore.plan.lower import lower
from outcore.plan.plan import Decision, Plan
from outcore.plan.schedule import Free, Schedule
from outcore.policies.common.layers import fuses_into_activation
from outcore.policies.common.variant_spec import variant_table
from outcore.policies.common.variants import (
    Variants,
    candidates,
    choice_by_op,
    peak_with,
    steps,
    with_variants,
)
from outcore.policies.registry import PolicyContext, PolicyFn, PolicyOutput, register
from outcore.policies.vdnn.config import VdnnAlgo, VdnnConfig, VdnnMode, VdnnStaticConfig
from outcore.policies.vdnn.prefetch import prefetch_points, sync_waits
from outcore.units import format_bytes
from outcore.variants import select

PAPER = "vDNN (Rhu et al., MICRO 2016)"
ALGOS = tuple(VdnnAlgo)  # "m", "p"
#: The offload modes (``VdnnMode.BASE``, the baseline, offloads nothing and keeps every map).
MODES = (VdnnMode.NONE, VdnnMode.CONV, VdnnMode.ALL)


@dataclass(kw_only=True)
class VdnnResult(PolicyOutput):
    """A vDNN policy's output (the one result type, ``PolicyOutput``) and what was chosen.

    ``mode``: the offload mode (``VdnnMode.BASE`` for the baseline); ``algo``: the uniform
    algorithm setting, or None for vDNN-dyn's per-layer choice; ``phase``: vDNN-dyn's
    profiling phase that chose the configuration (2, 3 or 4), else None; ``peak``: the peak
    bytes with each op's workspace as the context's cost model prices it (the paper's
    profiling passes; ``outcore.plan`` recomputes ``predicted_peak`` with the workspace capture
    recorded).
    """

    mode: VdnnMode
    algo: VdnnAlgo | None
    peak: int
    phase: int | None = None


# ---- which tensors move ---------------------------------------------------------------------

def _movable(graph: Graph) -> list[int]:
    return [t.id for t in graph.activations() if t.kind is not TensorKind.OUTPUT]


def _first_forward_layer(graph: Graph, group: list[int]) -> str | None:
    """The first forward non-view op reading a tensor of ``group`` (one storage's tensors)."""
    for tid in group:
        for oid in graph.tensors[tid].consumers:
            op = graph.ops[oid]
            if op.phase is Phase.FORWARD and op.category is not OpCategory.VIEW:
                return op.name
    return None


def offload_set(graph: Graph, mode: VdnnMode | str) -> dict[int, str]:
    """Tensor id -> why it is offloaded, for an offload mode (``MODES``; module docstring)."""
    mode = _parse_mode(mode, MODES)
    movable = _movable(graph)
    if mode is VdnnMode.NONE:
        return {}
    if mode is VdnnMode.ALL:
        result = {}
        groups = graph.aliases()  # once: it walks every tensor
        for tid in movable:
            layer = _first_forward_layer(graph, groups[tid])
            made_by = graph.tensors[tid].producer
            maker = graph.ops[made_by].name if made_by is not None else "?"
            result[tid] = (f"vDNN-all: X of layer {layer}" if layer else
                           f"vDNN-all: state layer {maker} keeps for its backward")
        return result
    wanted = set(movable)
    result = {}
    for op in graph.ops:
        if op.phase is Phase.FORWARD and op.category is OpCategory.CONV:
            for tid in op.inputs:
                storage = graph.tensors[tid].storage
                if storage in wanted and storage not in result:
                    result[storage] = f"vDNN-conv: X of CONV layer {op.name}"
    return result


def _parse_mode(mode: VdnnMode | str, allowed: Sequence[VdnnMode] = tuple(VdnnMode)) -> VdnnMode:
    """``mode`` as a ``VdnnMode`` among ``allowed``; PolicyOptionError lists them otherwise."""
    if mode not in allowed:
        valid = ", ".join(repr(m.value) for m in allowed)
        raise PolicyOptionError(f"vDNN mode must be one of {valid}, got {mode!r}", valid)
    return VdnnMode(mode)


def _parse_algo(algo: VdnnAlgo | str) -> VdnnAlgo:
    """``algo`` as a ``VdnnAlgo``; PolicyOptionError lists the settings otherwise."""
    if algo not in ALGOS:
        raise PolicyOptionError(f"vDNN algorithm setting must be 'm' (memory-optimal) or 'p' "
                                f"(performance-optimal), got {algo!r}", "'m' or 'p'")
    return VdnnAlgo(algo)


# ---- schedules ------------------------------------------------------------------------------

def release_schedule(graph: Graph, mode: VdnnMode | str, *, policy: str = "vdnn",
                     order: Sequence[int] | None = None) -> tuple[Plan, Schedule]:
    """vDNN's release + offload + Fig. 10 prefetch for ``mode``, without variants."""
    order = list(order) if order is not None else [op.id for op in graph.ops]
    offloads = offload_set(graph, mode)
    points = prefetch_points(graph, order, offloads)
    plan = Plan(policy=policy, prefetch_at=points.prefetch_at())
    for tid, why in offloads.items():
        plan.decisions[tid] = Decision.OFFLOAD
        how = (f"prefetched at {graph.ops[points.window[tid]].name} (Fig. 10 window)"
               if tid in points.window else "fetched on demand (no layer's window reaches it)")
        plan.reasons[tid] = f"{why}; {format_bytes(graph.tensors[tid].nbytes)}; {how}"
    for tid in _movable(graph):
        plan.reasons.setdefault(tid, "kept resident; released after its last use")
    schedule = lower(graph, plan, order=order)
    schedule = dataclasses.replace(schedule, instructions=sync_waits(schedule, points.window))
    return plan, schedule


def baseline_schedule(graph: Graph, *, policy: str = "vdnn-base") -> tuple[Plan, Schedule]:
    """Torch's baseline (Sec. IV-A): forward tensors never released, gradients reused.

    A forward tensor that only feeds an in-place activation (a conv output before its ReLU)
    is released after that read: in Torch the two are one buffer, counted once.
    """
    plan = Plan(policy=policy)
    for tid in _movable(graph):
        plan.reasons[tid] = "baseline: network-wide allocation keeps every feature map"
    schedule = lower(graph, plan)
    forward_made = {t.id for t in graph.tensors
                    if t.producer is not None and graph.ops[t.producer].phase is Phase.FORWARD
                    and not fuses_into_activation(graph, t.id)}
    kept = [ins for ins in schedule.instructions
            if not (isinstance(ins, Free) and ins.tensor in forward_made)]
    return plan, dataclasses.replace(schedule, instructions=kept)


def _hint(mode: VdnnMode, algo: VdnnAlgo) -> str:
    tries = []
    if algo is VdnnAlgo.PERFORMANCE:
        tries.append("the memory-optimal algorithms (algo='m')")
    if mode is not VdnnMode.ALL:
        tries.append("vdnn-all, which offloads every layer's input")
    tries.append("vdnn-dyn, which picks both to fit")
    return f"Try {', '.join(tries)}; or raise the budget or reduce the batch."


def _check_budget(name: str, budget: int | None, peak: int, hint: str) -> None:
    if budget is not None and peak > budget:
        raise InfeasibleBudgetError(name, budget, peak, hint)


def plan_static(graph: Graph, ctx: PolicyContext, mode: VdnnMode | str,
                algo: VdnnAlgo | str | None = None, *, name: str | None = None) -> VdnnResult:
    """vDNN-``mode`` (the baseline for ``VdnnMode.BASE``) for ``ctx`` (budget, cost model,
    ``VdnnStaticConfig``: variants and ``algo``); ``algo`` given here overrides the config's
    (the ``vdnn-{mode}-{algo}`` policies fix it in their name).

    Raises InfeasibleBudgetError when the predicted peak exceeds ``ctx.budget``, and
    PolicyOptionError (listing the valid values) for an unknown mode or algorithm setting.
    """
    config = _config(ctx)
    mode = _parse_mode(mode)
    if algo is None:
        algo = config.algo if isinstance(config, VdnnStaticConfig) else VdnnAlgo.PERFORMANCE
    setting = _parse_algo(algo)
    name = name or f"vdnn-{mode}-{setting}"
    if mode is VdnnMode.BASE:
        plan, schedule = baseline_schedule(graph, policy=name)
    else:
        plan, schedule = release_schedule(graph, mode, policy=name)
    table = candidates(graph, ctx.cost, variant_table(graph, config.variants))
    choice = (table.memory_optimal() if setting is VdnnAlgo.MEMORY
              else table.performance_optimal())
    peak = peak_with(graph, schedule, table, choice)
    _check_budget(name, ctx.budget, peak, _hint(mode, setting))
    plan.variants = dict(choice)
    plan.budget = ctx.budget
    return VdnnResult(plan, with_variants(schedule, choice), graph, mode=mode, algo=setting,
                      peak=peak)


def plan_dyn(graph: Graph, ctx: PolicyContext, *, name: str = "vdnn-dyn") -> VdnnResult:
    """vDNN-dyn's profiling passes (module docstring) for ``ctx`` (budget, cost model,
    ``VdnnConfig``'s variants); raises InfeasibleBudgetError when even vDNN-all with
    memory-optimal algorithms overflows ``ctx.budget``."""
    budget = ctx.budget
    table: Variants = candidates(graph, ctx.cost, variant_table(graph, _config(ctx).variants))
    built = {str(mode): release_schedule(graph, mode, policy=name) for mode in MODES}
    configs = {mode: steps(graph, schedule, table) for mode, (_, schedule) in built.items()}
    limit = budget if budget is not None else max(
        s.live_bytes + max((c.workspace_bytes for c in s.candidates), default=0)
        for rows in configs.values() for s in rows)
    result = select.vdnn_dyn(configs, limit)
    choice = choice_by_op(result.choice)
    plan, schedule = built[result.config]
    plan.variants = dict(choice)
    plan.budget = budget
    for tid in list(plan.reasons):
        plan.reasons[tid] += f" [vDNN-dyn: {result.config}, profiling phase {result.phase}]"
    peak = peak_with(graph, schedule, table, choice)
    return VdnnResult(plan, with_variants(schedule, choice), graph,
                      mode=VdnnMode(result.config), algo=None, peak=peak, phase=result.phase)


def _config(ctx: PolicyContext) -> VdnnConfig:
    """The context's vDNN configuration (a ``VdnnStaticConfig`` when it has an ``algo``)."""
    if isinstance(ctx.config, VdnnConfig):
        return ctx.config
    return ctx.config_as(VdnnStaticConfig if "algo" in ctx.options else VdnnConfig)


# ---- registration ---------------------------------------------------------------------------

def _static_policy(name: str, mode: VdnnMode, algo: VdnnAlgo | None) -> PolicyFn:
    """The policy ``name``: ``plan_static`` for ``mode``; ``algo`` None reads the config's."""
    def policy(graph: Graph, ctx: PolicyContext) -> PolicyOutput:
        if algo is None:
            ctx = dataclasses.replace(ctx, config=ctx.config_as(VdnnStaticConfig))
        else:
            ctx = dataclasses.replace(ctx, config=ctx.config_as(VdnnConfig))
        return plan_static(graph, ctx, mode, algo, name=name)

    policy.__name__ = name.replace("-", "_")
    return policy


_WHAT = {
    VdnnMode.ALL: "offload every layer's input feature map",
    VdnnMode.CONV: "offload the input feature maps of CONV layers",
    VdnnMode.BASE: "Torch baseline: keep every feature map for the whole step, reuse gradient "
                   "maps",
}
for _mode in (VdnnMode.ALL, VdnnMode.CONV, VdnnMode.BASE):
    register(f"vdnn-{_mode}", f"vDNN {_WHAT[_mode]}; options algo='m'|'p' (default 'p')",
             PAPER, VdnnStaticConfig)(_static_policy(f"vdnn-{_mode}", _mode, None))
for _mode in (VdnnMode.ALL, VdnnMode.CONV):
    for _a, _label in ((VdnnAlgo.MEMORY, "memory-optimal"),
                       (VdnnAlgo.PERFORMANCE, "performance-optimal")):
        register(f"vdnn-{_mode}-{_a}", f"vDNN {_WHAT[_mode]}, {_label} algorithms",
                 PAPER, VdnnConfig)(_static_policy(f"vdnn-{_mode}-{_a}", _mode, _a))


@register("vdnn-dyn", "vDNN-dyn: profiling passes choose the offloaded layers (none, conv, all) "
          "and per-layer algorithms, with a greedy downgrade", PAPER, VdnnConfig)
def vdnn_dyn_policy(graph: Graph, ctx: PolicyContext) -> PolicyOutput:
    return plan_dyn(graph, dataclasses.replace(ctx, config=ctx.config_as(VdnnConfig)))
