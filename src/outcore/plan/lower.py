"""Lowering: Plan -> Schedule (plain Python).

Three passes, each simple enough to check by eye:

1. **Sequence.** Forward ops in order; an ``Offload`` right after the producer of every
   offloaded activation ("an offload starts as soon as its producer finishes"). Then
   backward ops in order; before each, every input that is not resident is brought back:
   an offloaded base by ``Prefetch`` + ``Wait(h2d)``, a recomputed tensor (or a view of a
   dropped base) by recursively bringing back its producer's inputs and a
   ``Compute(recompute=True)``. Activations that are offloaded or recomputed (and their views)
   are not resident in backward until brought back.
2. **Frees.** Each tensor's residency is split into intervals at every (re)definition; a
   ``Free`` follows the last use of each interval (right after the definition when it has
   no use). An offloaded tensor's forward Free is preceded by ``Wait(d2h)``; both move to
   just before the forward op the plan names in ``release_at`` (a release point: the
   tensor stays resident until then, and the compute stream waits for its copy-out there,
   not right after its last forward use). Static tensors
   and the step's outputs (loss, gradients, buffer updates) are never freed.
   Parameters held in host memory and gradients sent there (``weights``, a
   ``outcore.plan.weights.WeightPlacement``) go through the same passes: a held parameter
   is brought in like an offloaded base before its first forward use and again in backward,
   and freed after each; a sent gradient's storage is offloaded after its op and freed.
3. **Prefetch window.** Each ``Prefetch`` is hoisted from just before its use to before the
   ``lookahead``-th earlier heavy compute (conv, matmul, attention), as vDNN prefetches
   during the previous layer, or to the op the plan names in ``prefetch_at``; never above
   the last Free of any tensor of its storage (a view may outlive its base's Free).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Mapping, Sequence

from outcore.errors import ScheduleError
from outcore.graph.ir import STATIC_KINDS, Graph, OpCategory, Phase, TensorKind
from outcore.plan.plan import Decision, Plan
from outcore.plan.schedule import Compute, Free, Instruction, Offload, Prefetch, Schedule, Wait
from outcore.plan.weights import WeightPlacement, sink_gradient_frees
from outcore.variants.names import Variant, is_framework

HEAVY = frozenset({OpCategory.CONV, OpCategory.MATMUL, OpCategory.ATTENTION})


def effective_decisions(graph: Graph, plan: Plan) -> dict[int, Decision]:
    """Storage id -> decision actually lowered. Only activations a policy may move are moved:
    static tensors and step outputs are always kept; an error names any other misuse.

    RECOMPUTE may also name a forward intermediate that backward never reads (a base
    activation outside ``graph.activations()``): it changes nothing in forward, but a
    recompute chain that needs it rebuilds it from its own inputs instead of keeping it
    alive from forward to backward (checkpoint segments: only the segment's input is kept).
    """
    movable = {t.id for t in graph.activations() if t.kind is not TensorKind.OUTPUT}
    rebuildable = forward_intermediates(graph)
    result: dict[int, Decision] = {}
    for tid, decision in plan.decisions.items():
        if decision is Decision.KEEP:
            continue
        if not 0 <= tid < len(graph.tensors):
            raise ScheduleError(f"plan {plan.policy!r} names unknown tensor {tid}")
        t = graph.tensors[tid]
        if t.is_view or t.kind in STATIC_KINDS:
            raise ScheduleError(f"plan {plan.policy!r} asks to {decision} {t.name!r}, which is a "
                                f"{'view' if t.is_view else t.kind}; decide about base activations")
        if tid in movable or (decision is Decision.RECOMPUTE and tid in rebuildable):
            result[tid] = decision
    return result


def forward_intermediates(graph: Graph) -> set[int]:
    """Base activations produced in forward that are not step outputs (whether or not
    backward reads them): what a recompute chain may rebuild. A ``Tensor.host`` value is
    never one (no policy may recompute it)."""
    return {t.id for t in graph.tensors
            if not t.is_view and t.kind is TensorKind.ACTIVATION and t.producer is not None
            and not t.host
            and graph.ops[t.producer].phase is Phase.FORWARD}


def check_variants(graph: Graph, plan: Plan) -> None:
    """Refuse, at planning time, a variant an op cannot run, with capture's recorded reason."""
    from outcore.variants.errors import VariantUnsupported

    for oid, variant in plan.variants.items():
        if not 0 <= oid < len(graph.ops):
            raise ScheduleError(f"plan {plan.policy!r} names a variant for unknown op {oid}")
        op = graph.ops[oid]
        if is_framework(variant):
            continue
        option = op.variant_options.get(variant)
        if option is None:
            known = ", ".join(dict.fromkeys([Variant.FRAMEWORK, *op.variant_options]))
            raise VariantUnsupported(op.target, variant, f"{op.name} has no such variant "
                                     f"(choose from {known})")
        if "refused" in option:
            raise VariantUnsupported(op.target, variant, f"{op.name}: {option['refused']}")


def lower(graph: Graph, plan: Plan, *, order: Sequence[int] | None = None,
          lookahead: int = 1, weights: WeightPlacement | None = None) -> Schedule:
    """Turn ``plan`` into a Schedule for ``graph`` (see the module docstring); ``weights``:
    parameters held in host memory and gradients sent there (``outcore.plan.weights``)."""
    ops = list(order) if order is not None else list(range(len(graph.ops)))
    if sorted(ops) != list(range(len(graph.ops))):
        raise ScheduleError("the execution order must list every op exactly once")
    ops = [o for o in ops if graph.ops[o].phase is Phase.FORWARD] + \
          [o for o in ops if graph.ops[o].phase is not Phase.FORWARD]
    decisions = effective_decisions(graph, plan)
    check_variants(graph, plan)
    weights = weights if weights is not None else WeightPlacement()
    weights.check(graph)
    if weights and (plan.sub_batches > 1 or not plan.free_at_last_use):
        raise ScheduleError(f"plan {plan.policy!r} splits the batch or keeps every allocation; "
                            "parameters held in host memory need one batch, freed at last use")
    seq, defs = _sequence(graph, ops, decisions, weights)
    keep = list(graph.outputs)
    release = _release_points(graph, plan, decisions)
    seq = _insert_frees(graph, seq, defs, keep, weights.movable(graph), release)
    seq = _free_unused_remakes(graph, seq, set(keep))
    if not plan.free_at_last_use:
        if decisions:
            raise ScheduleError(f"plan {plan.policy!r} keeps every allocation but also moves "
                                "tensors; network-wide allocation must keep everything")
        seq = [ins for ins in seq if not isinstance(ins, Free)]
    seq = _hoist_prefetches(graph, seq, plan.prefetch_at, lookahead)
    if weights.grads:
        seq = sink_gradient_frees(graph, seq, weights)
    return Schedule(instructions=seq, keep_at_end=keep, variants=dict(plan.variants),
                    sub_batches=plan.sub_batches, policy=plan.policy,
                    host_static=sorted(weights.params), host_outputs=sorted(weights.grads))


def _sequence(graph: Graph, ops: list[int], decisions: dict[int, Decision],
              weights: WeightPlacement) -> tuple[list[Instruction], dict[int, list[int]]]:
    """The instruction sequence without Frees, and each tensor's definition indices."""
    seq: list[Instruction] = []
    defs: dict[int, list[int]] = defaultdict(list)
    tensors = graph.tensors
    held, sent = weights.params, weights.grads
    forward = [o for o in ops if graph.ops[o].phase is Phase.FORWARD]
    fetched: set[int] = set()  # held parameters brought in during forward
    for oid in forward:
        for inp in graph.ops[oid].inputs:
            if inp in held and inp not in fetched:
                defs[inp].append(len(seq))
                seq += [Prefetch(inp), Wait(inp, "h2d")]
                fetched.add(inp)
        for out in graph.ops[oid].outputs:
            defs[out].append(len(seq))
        seq.append(Compute(oid))
        seq.extend(Offload(out) for out in graph.ops[oid].outputs
                   if decisions.get(out) is Decision.OFFLOAD)
    resident = {t.id for t in tensors
                if decisions.get(t.storage) is None and t.storage not in held}

    def ensure(tid: int) -> None:
        if tid in resident:
            return
        t = tensors[tid]
        if not t.is_view and (decisions.get(tid) is Decision.OFFLOAD or tid in held):
            defs[tid].append(len(seq))
            seq.append(Prefetch(tid))
            seq.append(Wait(tid, "h2d"))
            resident.add(tid)
            return
        producer = graph.producer_op(tid)  # recompute (or re-make a view of a dropped base)
        for inp in producer.inputs:
            ensure(inp)
        for out in producer.outputs:
            if out not in resident:
                defs[out].append(len(seq))
                resident.add(out)
        seq.append(Compute(producer.id, recompute=True))

    offloaded: set[int] = set()
    for oid in ops[len(forward):]:
        for inp in graph.ops[oid].inputs:
            ensure(inp)
        for out in graph.ops[oid].outputs:
            defs[out].append(len(seq))
            resident.add(out)
        seq.append(Compute(oid))
        for out in graph.ops[oid].outputs:  # a sent gradient leaves as soon as it is made
            base = tensors[out].storage
            if out in sent and base not in offloaded:
                seq.append(Offload(base))
                offloaded.add(base)
    return seq, defs


def free_points(graph: Graph, seq: list[Instruction], defs: Mapping[int, list[int]],
                keep: list[int], movable: frozenset[int] = frozenset()
                ) -> dict[int, list[tuple[int, bool]]]:
    """Index -> the tensors to free right after it, each with whether that residency was
    copied out (its Free then needs a ``Wait(d2h)`` first).

    ``defs`` gives, per tensor, the indices where it becomes resident (computed, recomputed
    or prefetched); each residency ends after its last use (Compute input, Offload, Wait)
    before the next definition, or right after its definition when nothing uses it. Static
    tensors and ``keep`` are never freed at the end of their last residency, except those of
    ``movable`` (parameters held in host memory, gradients sent there).
    """
    never_free = ({t.id for t in graph.tensors if t.kind in STATIC_KINDS} | set(keep)) - movable
    uses: dict[int, list[int]] = defaultdict(list)
    offloads: dict[int, list[int]] = defaultdict(list)
    for i, ins in enumerate(seq):
        if isinstance(ins, Compute):
            for inp in graph.ops[ins.op].inputs:
                uses[inp].append(i)
        elif isinstance(ins, Offload):
            uses[ins.tensor].append(i)
            offloads[ins.tensor].append(i)
        elif isinstance(ins, Wait):
            uses[ins.tensor].append(i)
    free_after: dict[int, list[tuple[int, bool]]] = defaultdict(list)
    for tid, starts in defs.items():
        bounds = [*starts, len(seq)]
        used, copies = uses.get(tid, ()), offloads.get(tid, ())
        for k, start in enumerate(starts):
            end = bounds[k + 1]
            if end == len(seq) and tid in never_free:
                continue
            # ``used`` and ``copies`` are ascending (appended in sequence order): the last
            # use before ``end`` and any copy-out in [start, end) by bisection
            j = bisect.bisect_left(used, end) - 1
            last = used[j] if j >= 0 and used[j] >= start else start
            c = bisect.bisect_left(copies, start)
            copied = c < len(copies) and copies[c] < end
            free_after[last].append((tid, copied))
    return free_after


def _release_points(graph: Graph, plan: Plan, decisions: dict[int, Decision]) -> dict[int, int]:
    """``plan.release_at`` checked: offloaded tensor -> the forward op its copy-out is waited
    for and its storage freed before."""
    for tid, oid in plan.release_at.items():
        if decisions.get(tid) is not Decision.OFFLOAD:
            raise ScheduleError(f"plan {plan.policy!r} names a release point for tensor {tid}, "
                                "which it does not offload; drop it from release_at")
        if not 0 <= oid < len(graph.ops) or graph.ops[oid].phase is not Phase.FORWARD:
            raise ScheduleError(f"plan {plan.policy!r} releases tensor {tid} before op {oid}, "
                                "which is not a forward op; name a forward op after its last "
                                "forward use")
    return dict(plan.release_at)


def _insert_frees(graph: Graph, seq: list[Instruction], defs: dict[int, list[int]],
                  keep: list[int], movable: frozenset[int] = frozenset(),
                  release_at: Mapping[int, int] | None = None) -> list[Instruction]:
    """Free every tensor after the last use of each residency interval; a copied-out
    residency named in ``release_at`` is waited for and freed just before that op's
    forward Compute instead, when that Compute comes after its last use."""
    free_after = free_points(graph, seq, defs, keep, movable)
    before: dict[int, list[int]] = defaultdict(list)
    if release_at:
        compute_at = {ins.op: i for i, ins in enumerate(seq)
                      if isinstance(ins, Compute) and not ins.recompute
                      and graph.ops[ins.op].phase is Phase.FORWARD}
        for i, frees in free_after.items():
            stay: list[tuple[int, bool]] = []
            for tid, copied in frees:
                at = compute_at.get(release_at[tid], -1) if copied and tid in release_at else -1
                if at > i:
                    before[at].append(tid)
                else:
                    stay.append((tid, copied))
            frees[:] = stay
    out: list[Instruction] = []
    for i, ins in enumerate(seq):
        for tid in before.get(i, ()):
            out += [Wait(tid, "d2h"), Free(tid)]
        out.append(ins)
        for tid, copied in free_after.get(i, []):
            if copied:
                out.append(Wait(tid, "d2h"))
            out.append(Free(tid))
    return out


def _free_unused_remakes(graph: Graph, seq: list[Instruction], keep: set[int]) -> list[Instruction]:
    """A recompute re-makes every output of its op. Outputs that were freed before it (so
    become resident again) but that nothing reads any more are freed right after it."""
    remade = {t for ins in seq if isinstance(ins, Compute) and ins.recompute
              for t in graph.ops[ins.op].outputs}
    if not remade:  # nothing is recomputed: nothing to free after a recompute
        return list(seq)
    touched: dict[int, list[int]] = defaultdict(list)  # tensor -> indices that read/free it
    for i, ins in enumerate(seq):  # (only the tensors a recompute makes are looked up)
        if isinstance(ins, Compute):
            for inp in graph.ops[ins.op].inputs:
                if inp in remade:
                    touched[inp].append(i)
        elif ins.tensor in remade:
            touched[ins.tensor].append(i)
    resident = {t.id for t in graph.tensors if t.kind in STATIC_KINDS}
    out: list[Instruction] = []
    for i, ins in enumerate(seq):
        out.append(ins)
        if isinstance(ins, Compute):
            fresh = [t for t in graph.ops[ins.op].outputs if t not in resident]
            resident.update(graph.ops[ins.op].outputs)
            if ins.recompute:
                for tid in fresh:
                    later = touched.get(tid, [])
                    if tid not in keep and bisect.bisect_right(later, i) == len(later):
                        out.append(Free(tid))
                        resident.discard(tid)
        elif isinstance(ins, Free):
            resident.discard(ins.tensor)
        elif isinstance(ins, Prefetch):
            resident.add(ins.tensor)
    return out


def _hoist_prefetches(graph: Graph, seq: list[Instruction], prefetch_at: dict[int, int],
                      lookahead: int) -> list[Instruction]:
    """Move each Prefetch up to its window (see the module docstring). O(n log n).

    Hoisting only moves Prefetches, so every target can be found on the original sequence:
    the ``lookahead``-th heavy Compute before the Prefetch, or the Compute of the op named in
    ``prefetch_at``, but never above the last Free of any tensor of its storage (a view of
    the base may outlive the base's own Free; a prefetch above it would hold two copies).
    """
    if not any(isinstance(ins, Prefetch) for ins in seq):
        return list(seq)  # nothing to move
    heavy: list[int] = []
    computes_of: dict[int, list[int]] = defaultdict(list)
    last_free: dict[int, int] = {}  # storage -> index of the latest Free of one of its tensors
    moves: dict[int, list[int]] = defaultdict(list)  # target index -> prefetch indices
    moved: set[int] = set()
    for i, ins in enumerate(seq):
        if isinstance(ins, Compute):
            computes_of[ins.op].append(i)
            if graph.ops[ins.op].category in HEAVY:
                heavy.append(i)
        elif isinstance(ins, Free):
            last_free[graph.tensors[ins.tensor].storage] = i
        elif isinstance(ins, Prefetch):
            floor = last_free.get(graph.tensors[ins.tensor].storage, -1) + 1
            target = i
            if ins.tensor in prefetch_at:
                at = computes_of.get(prefetch_at[ins.tensor], [])
                k = bisect.bisect_left(at, floor)
                if k < len(at) and at[k] < i:
                    target = at[k]
            else:
                k = bisect.bisect_left(heavy, i) - max(1, lookahead)
                k = max(k, bisect.bisect_left(heavy, floor))
                if 0 <= k < len(heavy) and floor <= heavy[k] < i:
                    target = heavy[k]
            if target < i:
                moves[target].append(i)
                moved.add(i)
    result: list[Instruction] = []
    for i, ins in enumerate(seq):
        result.extend(seq[j] for j in moves.get(i, []))
        if i not in moved:
            result.append(ins)
    return result
