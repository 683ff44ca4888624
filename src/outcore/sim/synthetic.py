"""Synthetic graphs and simple schedules, in plain Python, for tests and the speed benchmark.

``residual_chain(units)`` builds a ResNet-like training step without torch: each residual
unit is conv -> relu -> norm -> add(skip), and its backward mirrors it (norm, relu and conv
backward, then a gradient join for the skip). 2500 units give SuperNeurons' 10^4-layer
ResNet (10,000 forward ops).

``keep_all_schedule`` frees every tensor after its last use; ``offload_all_schedule`` also
offloads every activation that backward reads, right after it is produced, frees it after
its last forward use, and prefetches it ``window`` ops before its first backward use.
These are not planners (see outcore.policies): they make valid schedules of a known shape.
Both handle graphs without views; in a graph with views, activations that have views are
kept rather than offloaded.
"""

from __future__ import annotations

from outcore.graph.ir import STATIC_KINDS, Graph, Op, OpCategory, Phase, Tensor, TensorKind
from outcore.plan.schedule import Compute, Free, Instruction, Offload, Prefetch, Schedule, Wait


class _Builder:
    def __init__(self) -> None:
        self.tensors: list[Tensor] = []
        self.ops: list[Op] = []

    def tensor(self, name: str, nbytes: int, kind: TensorKind, shape: tuple[int, ...] = ()) -> int:
        tid = len(self.tensors)
        shape = shape or (nbytes // 4,)
        self.tensors.append(Tensor(tid, name, shape, "float32", nbytes, kind, tid))
        return tid

    def op(self, name: str, category: OpCategory, phase: Phase, inputs: list[int],
           outputs: list[tuple[str, int, TensorKind]], flops: float) -> list[int]:
        oid = len(self.ops)
        out_ids = []
        for out_name, nbytes, kind in outputs:
            tid = self.tensor(out_name, nbytes, kind)
            self.tensors[tid].producer = oid
            out_ids.append(tid)
        for tid in inputs:
            if oid not in self.tensors[tid].consumers:
                self.tensors[tid].consumers.append(oid)
        touched = sum(self.tensors[t].nbytes for t in (*inputs, *out_ids))
        self.ops.append(Op(oid, name, f"synthetic.{category.value}", phase, category,
                           list(inputs), out_ids, flops=flops, bytes_touched=touched))
        return out_ids


def residual_chain(units: int, *, activation_bytes: int = 1 << 20, param_bytes: int = 1 << 16,
                   conv_flops: float = 2e9, name: str | None = None) -> Graph:
    """A ResNet-like step of ``units`` residual units (4 forward + 4 backward ops each).

    Activations are ``activation_bytes`` each, weights ``param_bytes``; a convolution does
    ``conv_flops`` (its backward twice that), element-wise ops one FLOP per 4 bytes.
    """
    if units < 1:
        raise ValueError(f"residual_chain needs units >= 1, got {units}")
    b = _Builder()
    A, ACT, GRAD = activation_bytes, TensorKind.ACTIVATION, TensorKind.GRADIENT
    F, B = Phase.FORWARD, Phase.BACKWARD
    ew = A / 4
    h = b.tensor("x", A, TensorKind.INPUT)
    weights, saved = [], []
    for u in range(units):
        w = b.tensor(f"w{u}", param_bytes, TensorKind.PARAMETER)
        (c,) = b.op(f"conv{u}", OpCategory.CONV, F, [h, w], [(f"c{u}", A, ACT)], conv_flops)
        (r,) = b.op(f"relu{u}", OpCategory.ELEMENTWISE, F, [c], [(f"r{u}", A, ACT)], ew)
        (n,) = b.op(f"norm{u}", OpCategory.NORM, F, [r], [(f"n{u}", A, ACT)], 4 * ew)
        weights.append(w)
        saved.append((h, r))
        (h,) = b.op(f"add{u}", OpCategory.ELEMENTWISE, F, [n, h], [(f"h{u + 1}", A, ACT)], ew)
    (loss,) = b.op("loss", OpCategory.LOSS, F, [h], [("loss", 4, TensorKind.OUTPUT)], 2 * ew)
    tangent = b.tensor("tangents_1", 4, TensorKind.TANGENT)
    (g,) = b.op("loss_backward", OpCategory.LOSS, B, [tangent, h], [("g_out", A, GRAD)], 2 * ew)
    grads = []
    for u in reversed(range(units)):
        h_in, r = saved[u]
        (gn,) = b.op(f"norm_bwd{u}", OpCategory.NORM, B, [g, r], [(f"g_r{u}", A, GRAD)], 8 * ew)
        (gc,) = b.op(f"relu_bwd{u}", OpCategory.ELEMENTWISE, B, [gn, r], [(f"g_c{u}", A, GRAD)], ew)
        gx, gw = b.op(f"conv_bwd{u}", OpCategory.CONV, B, [gc, h_in, weights[u]],
                      [(f"g_branch{u}", A, GRAD), (f"g_w{u}", param_bytes, GRAD)], 2 * conv_flops)
        b.tensors[gw].source = f"grad:w{u}"
        grads.append(gw)
        (g,) = b.op(f"join_bwd{u}", OpCategory.ELEMENTWISE, B, [g, gx], [(f"g_h{u}", A, GRAD)], ew)
    graph = Graph(b.tensors, b.ops, outputs=[loss, *grads], name=name or f"residual{units}")
    graph.validate()
    return graph


def _last_uses(graph: Graph) -> tuple[dict[int, list[int]], set[int]]:
    """op id -> tensors whose last reader it is (dead outputs: their producer); and the set
    of tensors never freed (static inputs and graph outputs)."""
    keep = set(graph.outputs) | {t.id for t in graph.tensors if t.kind in STATIC_KINDS}
    frees: dict[int, list[int]] = {}
    for t in graph.tensors:
        if t.id in keep:
            continue
        last = max(t.consumers, default=t.producer)
        if last is not None:
            frees.setdefault(last, []).append(t.id)
    return frees, keep


def keep_all_schedule(graph: Graph) -> Schedule:
    """Every op in order; each tensor freed right after its last reader."""
    frees, _ = _last_uses(graph)
    instructions: list[Instruction] = []
    for op in graph.ops:
        instructions.append(Compute(op.id))
        instructions.extend(Free(t) for t in frees.get(op.id, ()))
    return Schedule(instructions, keep_at_end=list(graph.outputs), policy="synthetic-keep-all")


def offload_all_schedule(graph: Graph, window: int = 2) -> Schedule:
    """Offload every view-free activation backward reads; prefetch it ``window`` ops ahead."""
    if window < 0:
        raise ValueError(f"window must be >= 0, got {window}")
    frees, _ = _last_uses(graph)
    aliases = graph.aliases()
    phase = [op.phase for op in graph.ops]
    movable = [t.id for t in graph.activations() if len(aliases[t.id]) == 1]
    after_fwd: dict[int, list[int]] = {}  # op -> tensors to Wait+Free after (last forward use)
    prefetch_before: dict[int, list[int]] = {}
    wait_before: dict[int, list[int]] = {}
    for tid in movable:
        tensor = graph.tensors[tid]
        assert tensor.producer is not None  # activations are produced in forward
        fwd = [c for c in tensor.consumers if phase[c] is Phase.FORWARD]
        bwd = sorted(c for c in tensor.consumers if phase[c] is not Phase.FORWARD)
        last_fwd = max(fwd, default=tensor.producer)
        after_fwd.setdefault(last_fwd, []).append(tid)
        first_bwd = bwd[0]
        issue_at = max(first_bwd - window, last_fwd + 1)
        prefetch_before.setdefault(issue_at, []).append(tid)
        wait_before.setdefault(first_bwd, []).append(tid)
    moved = set(movable)
    instructions: list[Instruction] = []
    for op in graph.ops:
        instructions.extend(Prefetch(t) for t in prefetch_before.get(op.id, ()))
        instructions.extend(Wait(t, "h2d") for t in wait_before.get(op.id, ()))
        instructions.append(Compute(op.id))
        instructions.extend(Offload(t) for t in op.outputs if t in moved)
        for t in after_fwd.get(op.id, ()):
            instructions += [Wait(t, "d2h"), Free(t)]
        instructions.extend(Free(t) for t in frees.get(op.id, ()))
    return Schedule(instructions, keep_at_end=list(graph.outputs), policy="synthetic-offload-all")
