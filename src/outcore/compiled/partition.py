"""outcore's plan as Inductor's partitioner: the saved set is outcore's, the kernels Inductor's.

``torch.compile`` (aot_autograd) traces a compiled graph's forward and backward as one joint
graph, then a *partitioner* splits it into a forward and a backward graph: it picks the
tensors the forward saves for the backward, and the backward recomputes every other forward
value it needs from them. Inductor then compiles both graphs into fused kernels. Its default
partitioner (min-cut, with ``activation_memory_budget``) chooses the saved set by its own
heuristics. ``OutcorePartitioner`` chooses it with outcore's planner instead:

1. The joint graph (after Inductor's joint-graph passes, dead code removed; under Inductor's
   ``fallback_random``, ``inductor_backend``'s default, each eager dropout's output
   rewritten as input * mask * scale, so the backward needs its mask alone:
   ``dropout.mask_only_dropout``) is converted to outcore's IR with the same converter
   ``outcore.capture`` uses (``build_graph``); the
   phases are read from the dataflow, Inductor's seeded random ops are planned as
   point-wise (``_seeded_as_pointwise``), the outputs of the random ops left (eager's
   ``native_dropout``, ``inductor_seeds``) are flagged ``Tensor.host``, which no policy
   recomputes, so the plan keeps them and counts them (``_undrawable_kept``), the library
   kernels' scratch is measured (``temporaries.measure_extern``), and the graph is
   contracted as Inductor fuses it (``fusion.fuse_elementwise``; ``fusion=False`` plans it
   op by op). The forward's outputs the backward does not read leave, and the tangents
   arrive, when the backward starts (``lifetimes``), as in a training step whose loss is
   computed outside the graph.
2. ``outcore.plan`` plans it under the budget, recompute only (``host_budget=0``): outcore-auto
   by default, whose plans recompute chains of any depth. A schedule that re-makes a tensor
   during the forward cannot be split; outcore-auto then uses its own greedy plan
   (``portfolio=False``), as ``outcore.backend`` does. Under outcore-auto the plan of
   ``fused-first`` (``fused_first``: fused element-wise work recomputed
   first, a matrix product only when memory forces it) is planned too, and the plan that
   recomputes fewer heavy flops (matmul, convolution, attention; ties: fewer random elements
   drawn again by Inductor's generator, then the faster simulated step) is taken: on
   Inductor's fused graph a recomputed element-wise op is a pass over memory inside a fused
   kernel, a recomputed matrix product its whole flops again and a re-drawn dropout mask
   tens of ns per element, which the cost model's per-op prices do not see. A plan that
   still holds a tensor in host memory is refused (``OffloadNotCompiledError``): Inductor's
   graphs run no copies.
3. The tensors resident at the schedule's forward/backward cut (``saved.kept_at_cut``) are the
   saved set; forward nodes the backward cannot recompute (RNG seeds, mutations) are added
   and reported as *forced* (``saved.saved_nodes``). torch's ``_extract_fwd_bwd_modules``
   builds the two graphs; the backward's ops are reordered as autograd would run them
   (recomputation just before its first use), as the min-cut partitioner does.

Every partition is recorded (``Partition``): the plan, the saved, kept and forced node names,
and the predicted peak, so a test or a user can check what ran against what was planned.

Memory: the plan's predicted peak is for the fused graph in the schedule's order. Inductor
runs the same saved set with its own kernels (its inlining may go beyond ``fusion``'s rule,
which only errs towards materialising) in its own backward order, freeing each buffer after
its last use when its buffer reuse is off (``inductor_backend``'s default; on, it holds
freed buffers for later reuse beyond the plan). The saved set (what the forward leaves for
the backward) is the plan's; the backward's transient peak is Inductor's (measured, not
bounded in general, by the plan: library kernels may allocate scratch for Inductor's
strides that ``temporaries`` does not see).
"""

from __future__ import annotations

import math
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx
from torch._functorch import config as functorch_config
from torch._functorch import partitioners as tp
from torch._inductor.custom_graph_pass import CustomPartitionerFn

from outcore.capture.convert import NodeMap, build_graph
from outcore.errors import CaptureError, InfeasibleBudgetError, ScheduleError
from outcore.graph.ir import Graph, OpCategory, Phase, TensorKind
from outcore.plan.schedule import Compute, Offload, Prefetch
from outcore.planned import PlannedStep, plan
from outcore.runtime.split import split_point

from .dropout import mask_only_dropout
from .fused_first import HEAVY, INLINE_DRAWS, plan_fused_first
from .fusion import fuse_elementwise
from .heavy import node_flops, recomputed_nodes
from .lifetimes import as_in_a_training_step
from .recompute_order import mark_recomputed
from .saved import kept_at_cut, kept_names, saved_nodes
from .temporaries import measure_extern

#: Names of outcore-auto (whose portfolio may pick a plan the forward/backward cut refuses).
_AUTO = ("auto", "outcore-auto")


class OffloadNotCompiledError(ScheduleError):
    """outcore's plan for this budget moves tensors to host memory, which Inductor's compiled
    graphs cannot do (they only keep or recompute)."""


@dataclass
class Partition:
    """What ``OutcorePartitioner`` decided for one joint graph (module docstring)."""

    planned: PlannedStep
    saved: list[str]  # the forward graph's saved outputs, as passed to the backward
    kept: list[str]  # the plan's kept forward activations among them
    forced: list[str]  # saved although the plan does not keep them (``saved.is_forced``)
    plan_kept: set[str] = field(default_factory=set)  # every activation the plan keeps
    forward_saved: list[str] = field(default_factory=list)  # read off the forward graph
    # forward_saved activations (neither graph inputs nor forced) whose storage the plan
    # does not hold at the cut: empty when the compiled forward saves only what was planned
    outside_plan: list[str] = field(default_factory=list)
    plan_kept_bytes: int = 0  # storages of the activations (and outputs) held at the cut
    recomputed: int = 0  # forward ops the backward graph runs again
    recomputed_targets: dict[str, int] = field(default_factory=dict)  # their ops, counted
    recomputed_heavy_flops: int = 0  # flops of the matmuls/convolutions among them (heavy.py)
    forced_bytes: int = 0
    saved_bytes: int = 0  # storages of the saved activations (graph inputs' left out)

    @property
    def predicted_peak(self) -> int:
        """The plan's peak for outcore's executor (parameters and inputs included)."""
        return self.planned.predicted_peak


def _static_shapes(gm: fx.GraphModule) -> None:
    for node in gm.graph.find_nodes(op="placeholder"):
        val = node.meta.get("val")
        if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)) or (
                isinstance(val, torch.Tensor)
                and not all(isinstance(s, int) for s in val.shape)):
            raise CaptureError(
                f"the compiled graph has a dynamic shape ({node.name}: {val}); outcore plans "
                "static shapes: pass dynamic=False to torch.compile (it then recompiles, and "
                "outcore plans again, for each new shape)")


def _phases_from_dataflow(graph: Graph, nodes: NodeMap, info: tp.NodeInfo) -> None:
    """Set each op's phase from the dataflow: forward iff the forward outputs need it.

    The joint graph's ``partitioner_tag`` is not enough: Inductor's joint-graph passes insert
    untagged nodes among the backward's (read as forward, they would be scheduled before the
    backward values they read). A node the forward does not need runs in the backward."""
    for op, node in zip(graph.ops, nodes.op_nodes, strict=True):
        op.phase = Phase.FORWARD if info.is_required_fw(node) else Phase.BACKWARD
        wanted = TensorKind.ACTIVATION if op.phase is Phase.FORWARD else TensorKind.GRADIENT
        for tid in op.outputs:
            if graph.tensors[tid].kind in (TensorKind.ACTIVATION, TensorKind.GRADIENT):
                graph.tensors[tid].kind = wanted




def _seeded_ops() -> tuple[Any, ...]:
    import torch._inductor.inductor_prims

    prims = torch.ops.prims
    return (prims.inductor_lookup_seed.default, prims.inductor_random.default,
            prims.inductor_randint.default)


def _seeded_as_pointwise(graph: Graph, nodes: NodeMap) -> None:
    """Inductor's random ops draw from an explicit seed tensor (``inductor_lookup_seed`` of
    the one ``inductor_seeds`` draw): a pure function of that seed, generated inline in a
    point-wise kernel. Plan them so: not random (no RNG state to replay; recomputing one
    from the saved seed gives the same draw), element-wise (fused, so a dropout mask is
    recomputed from a few bytes of seed instead of being kept). ``inductor_seeds`` itself
    stays random and is saved (``saved.is_forced``)."""
    seeded = _seeded_ops()
    for op, node in zip(graph.ops, nodes.op_nodes, strict=True):
        if node.target in seeded:
            op.random = False
            op.category = OpCategory.ELEMENTWISE


def _undrawable_kept(graph: Graph) -> int:
    """Mark every output of a random op left after ``_seeded_as_pointwise`` (eager's
    ``native_dropout`` under ``fallback_random``, ``inductor_seeds``) as ``Tensor.host``:
    the compiled backward cannot draw it again, so no policy may recompute (or offload) it
    (it is never among ``Graph.activations`` nor ``lower.forward_intermediates``). The plan
    keeps it to its last read and counts its bytes in the predicted peak, so the partition
    saves it as kept, not *forced* outside the plan. The flag's other meaning (held in host
    memory on an accelerator) changes nothing here: the memory rule counts a host-flagged
    output as any other. Returns the number of tensors marked."""
    marked = 0
    for op in graph.ops:
        if op.random:
            for tid in op.outputs:
                graph.tensors[tid].host = True
                marked += 1
    return marked


#: The IR targets of Inductor's inline random draws (``_seeded_ops`` but the seed lookup).
_DRAW_TARGETS = ("prims.inductor_random.default", "prims.inductor_randint.default")


def _draws(graph: Graph, merged: dict[int, list[int]] | None = None) -> dict[int, int]:
    """Op id -> random elements the op draws inline (Inductor's seeded random ops, counted
    on ``graph``; ``merged`` maps a fused graph's op ids to ``graph``'s, whose draws are
    summed). On this CPU Inductor's generator costs tens of ns per element on one thread
    (the full-size GPT's forward kernels: 0.71 s, against 0.17 s for eager's
    ``bernoulli_``), so fused-first keeps what re-drawing would rebuild first
    (``fused_first.INLINE_DRAWS``)."""
    own = {op.id: math.prod(graph.tensors[op.outputs[0]].shape) for op in graph.ops
           if op.target in _DRAW_TARGETS}
    if merged is None:
        return own
    return {new: sum(own.get(m, 0) for m in old) for new, old in merged.items()
            if any(m in own for m in old)}


def pytree_leaves(module: fx.GraphModule) -> list[Any]:
    """The values a graph module returns, flattened."""
    [out] = module.graph.find_nodes(op="output")
    return list(torch.utils._pytree.arg_tree_leaves(*out.args))


def _storage_bytes(saved: list[fx.Node], inputs: list[fx.Node]) -> int:
    """Bytes of the distinct storages ``saved`` live in, less those of ``inputs`` (a saved
    view of a parameter, say a transposed weight, costs nothing beyond the parameter)."""
    def key(node: fx.Node) -> tuple[int, int] | None:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            storage = val.untyped_storage()
            return storage._cdata, int(storage.nbytes())
        return None

    held = {k[0] for k in map(key, inputs) if k is not None}
    storages = dict(k for k in map(key, saved) if k is not None and k[0] not in held)
    return sum(storages.values())


def _outside_plan(graph: Graph, nodes: NodeMap, kept: set[int], fw_saved: list[fx.Node],
                  forced: list[fx.Node]) -> list[str]:
    """Names of the forward graph's saved activations whose storage the plan does not hold
    at the cut (graph inputs and forced nodes left out). ``fw_saved`` are the forward
    module's nodes; they are matched to the joint graph's by name."""
    storages = {graph.tensors[t].storage for t in kept}
    by_name = {node.name: tid for node, tid in nodes.node_tensors.items()}
    skip = {n.name for n in forced}
    out = []
    for node in fw_saved:
        tid = by_name.get(node.name)
        if node.name in skip or tid is None or graph.tensors[tid].kind is not TensorKind.ACTIVATION:
            continue
        if graph.tensors[tid].storage not in storages:
            out.append(node.name)
    return out


def _nbytes(node: fx.Node) -> int:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return int(val.untyped_storage().nbytes())
    return 0


def planned_heavy_flops(planned: PlannedStep) -> float:
    """Flops of the heavy ops (``fused_first.HEAVY``) the schedule computes again."""
    ops = planned.graph.ops
    return sum(float(ops[ins.op].flops) for ins in planned.schedule.instructions
               if isinstance(ins, Compute) and ins.recompute and ops[ins.op].category in HEAVY)


def planned_draws(planned: PlannedStep) -> int:
    """Random elements the schedule's recomputes draw again (``INLINE_DRAWS``)."""
    draws = planned.graph.meta.get(INLINE_DRAWS, {})
    return sum(draws.get(ins.op, 0) for ins in planned.schedule.instructions
               if isinstance(ins, Compute) and ins.recompute)


def _lighter(a: PlannedStep, b: PlannedStep) -> bool:
    """True when ``a`` recomputes fewer heavy flops than ``b``; on a tie, fewer random
    draws (``planned_draws``); then a faster simulated step (a plan without a simulation is
    not faster)."""
    fa, fb = planned_heavy_flops(a), planned_heavy_flops(b)
    if fa != fb:
        return fa < fb
    da, db = planned_draws(a), planned_draws(b)
    if da != db:
        return da < db
    ta = a.simulation.step_time if a.simulation is not None else float("inf")
    tb = b.simulation.step_time if b.simulation is not None else float("inf")
    return ta < tb


class OutcorePartitioner(CustomPartitionerFn):
    """A ``torch._inductor.config.custom_partitioner_fn`` that saves what outcore's plan keeps.

    Args:
        budget: device bytes per compiled graph (None: unbounded), as ``outcore.plan`` takes.
        policy: an ``outcore.policies()`` name ("auto": outcore-auto).
        gpu: the hardware profile the plan is priced on ("this-cpu", "a100", ...).
        fusion: plan the graph as Inductor fuses it (``fusion.fuse_elementwise``: element-wise
            values read once by a point-wise op or a reduction are not materialised); on by
            default. False plans the decomposed graph op by op, every value a buffer.
        measure: measure the scratch of the library kernels Inductor calls (convolutions,
            matrix products, attention; ``temporaries.measure_extern``), so the predicted
            peak counts it; on by default (each such op run once alone, on the CPU).
        scope: what ``budget`` bounds, as ``outcore.plan``'s ("step" or "activations").
        options: passed to ``outcore.plan`` (``host_budget`` defaults to 0: recompute only).
    """

    def __init__(self, budget: int | None, policy: str = "auto", gpu: str | None = None,
                 *, fusion: bool = True, measure: bool = True, scope: str = "step",
                 **options: Any) -> None:
        self.budget = budget
        self.scope = scope
        self.fusion = fusion
        self.measure = measure
        self.policy = policy
        self.gpu = gpu
        self.options = {"host_budget": 0, **options}
        self.partitions: list[Partition] = []
        self._key = f"outcore-{uuid.uuid4().hex}"

    def uuid(self) -> Any:
        """A key unique to this partitioner object. Inductor's caches key compiled graphs on
        it: None would be the key of its own min-cut partitioner (a cached min-cut graph
        would be reused for outcore's, and back), and a key from the budget alone would skip
        the plan (and its ``Partition`` record) in a later process."""
        return self._key

    def __call__(self, gm: fx.GraphModule, joint_inputs: Sequence[object],
                 **kwargs: Any) -> tuple[fx.GraphModule, fx.GraphModule]:
        """Split the joint graph ``gm`` (module docstring); ``kwargs`` are aot_autograd's:
        ``num_fwd_outputs`` and ``static_lifetime_input_indices`` are read."""
        num_fwd_outputs = int(kwargs["num_fwd_outputs"])
        static_lifetime_input_indices = kwargs.get("static_lifetime_input_indices")
        mask_only_dropout(gm)  # eager-generator dropouts hand the backward their masks only
        gm.graph.eliminate_dead_code()
        gm.recompile()
        if functorch_config.cse:  # as the min-cut partitioner: the graph it would split
            gm.graph = tp.fx_graph_cse(gm.graph)
            gm.recompile()
        _static_shapes(gm)
        tp.force_save_collectives(gm)
        tp.force_save_effectful_ops(gm)
        tp.force_save_bw_mutation_src(gm)
        info = tp.classify_nodes(gm, static_lifetime_input_indices or [], num_fwd_outputs)
        graph, nodes = build_graph(gm, f"inductor{len(self.partitions)}")
        _phases_from_dataflow(graph, nodes, info)
        _seeded_as_pointwise(graph, nodes)
        _undrawable_kept(graph)
        if self.measure:
            measure_extern(graph, nodes)
        if self.fusion:
            fused = fuse_elementwise(graph, frozenset(_draws(graph)))
            fused.graph.meta[INLINE_DRAWS] = _draws(graph, fused.merged)
            as_in_a_training_step(fused.graph)
            planned = self._plan(fused.graph)
            kept = {fused.original[t] for t in kept_at_cut(planned)}
        else:
            graph.meta[INLINE_DRAWS] = _draws(graph)
            as_in_a_training_step(graph)
            planned = self._plan(graph)
            kept = kept_at_cut(planned)
        _, bwd_outputs, _, _ = tp._extract_fwd_bwd_outputs(gm, num_fwd_outputs=num_fwd_outputs)
        forward = set(info.required_fw_nodes)
        chosen = saved_nodes(nodes, kept, forward, bwd_outputs)
        order = {n: i for i, n in enumerate(gm.graph.nodes)}
        saved = chosen.nodes(order)
        fw_module, bw_module = tp._extract_fwd_bwd_modules(
            gm, saved, saved_sym_nodes=[], num_fwd_outputs=num_fwd_outputs,
            static_lifetime_input_nodes=info.static_lifetime_input_nodes)
        bw_module = tp.reordering_to_mimic_autograd_engine(bw_module)
        fw_module = tp.raise_getitems(fw_module)
        bw_module = tp.raise_getitems(bw_module)
        names = [n.name for n in saved]  # pruned by the extraction to what the backward reads
        fw_out = pytree_leaves(fw_module)
        fw_saved = [n for n in fw_out[num_fwd_outputs:] if isinstance(n, fx.Node)]
        redone = recomputed_nodes(fw_module, bw_module)
        mark_recomputed(redone)  # no recompute kernel fused with backward work (recompute_order)
        again = Counter(str(n.target) for n in redone)
        self.partitions.append(Partition(
            planned=planned, saved=names,
            kept=[n.name for n in chosen.kept if n.name in names],
            forced=[n.name for n in chosen.forced if n.name in names],
            plan_kept=kept_names(graph, nodes, kept),
            forward_saved=[n.name for n in fw_saved],
            outside_plan=_outside_plan(graph, nodes, kept, fw_saved, chosen.forced),
            plan_kept_bytes=sum(graph.tensors[s].nbytes for s in {
                graph.tensors[t].storage for t in kept}
                if graph.tensors[s].kind in (TensorKind.ACTIVATION, TensorKind.OUTPUT)),
            recomputed=sum(again.values()), recomputed_targets=dict(again),
            recomputed_heavy_flops=sum(node_flops(n) for n in redone),
            forced_bytes=sum(_nbytes(n) for n in chosen.forced if n.name in names),
            saved_bytes=_storage_bytes([n for n in saved if n not in chosen.primals],
                                       list(gm.graph.find_nodes(op="placeholder")))))
        return fw_module, bw_module

    def _plan(self, graph: Any) -> PlannedStep:
        """Plan ``graph``; under outcore-auto, a plan that cannot be cut into a forward and a
        backward is replaced by its greedy planner's, and fused-first's plan is taken when
        it recomputes fewer heavy flops (module docstring); a plan that offloads is
        refused."""
        try:
            planned: PlannedStep | None = self._plan_auto(graph)
        except InfeasibleBudgetError as err:
            if self.policy not in _AUTO:
                raise
            planned, refused = None, err
        if self.policy in _AUTO and self.budget is not None:
            try:
                other = plan_fused_first(graph, self.budget, self.gpu, self.scope)
            except InfeasibleBudgetError:
                other = None
            if other is not None and (planned is None or _lighter(other, planned)):
                planned = other
        if planned is None:
            raise refused
        return self._recompute_only(planned)

    def _plan_auto(self, graph: Any) -> PlannedStep:
        """The plan of ``self.policy``, split-able (outcore-auto's greedy plan otherwise)."""
        planned = plan(graph, self.budget, policy=self.policy, gpu=self.gpu, scope=self.scope,
                       **self.options)
        try:
            split_point(planned.graph, planned.schedule)
        except ScheduleError:
            if self.policy not in _AUTO or self.options.get("portfolio") is False:
                raise
            planned = plan(graph, self.budget, policy=self.policy, gpu=self.gpu,
                           scope=self.scope, **{**self.options, "portfolio": False})
        return planned

    def _recompute_only(self, planned: PlannedStep) -> PlannedStep:
        """``planned``, or OffloadNotCompiledError when it moves tensors or splits the batch."""
        moved = sum(1 for ins in planned.schedule.instructions
                    if isinstance(ins, (Offload, Prefetch))) + len(planned.schedule.host_static)
        if moved or planned.plan.sub_batches > 1:
            raise OffloadNotCompiledError(
                f"outcore's plan ({planned.plan.policy}) for this budget "
                + (f"moves {moved} tensors through host memory" if moved
                   else f"splits the batch into {planned.plan.sub_batches} sub-batches")
                + "; Inductor's compiled graphs can only keep or recompute. Raise the budget, "
                "keep host_budget=0 (the default here), or train with outcore.compile(...) or "
                "outcore.backend(...), which run offloads")
        return planned
