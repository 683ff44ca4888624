"""``outcore.compiled.fusion``: the joint graph contracted as Inductor fuses it (pure IR)."""

from __future__ import annotations

from outcore.compiled.fusion import fuse_elementwise
from outcore.graph.ir import Graph, Op, OpCategory, Phase, Tensor, TensorKind

F, B = Phase.FORWARD, Phase.BACKWARD
EW, MM, RED = OpCategory.ELEMENTWISE, OpCategory.MATMUL, OpCategory.REDUCTION


class _Builder:
    def __init__(self) -> None:
        self.tensors: list[Tensor] = []
        self.ops: list[Op] = []

    def tensor(self, name: str, kind: TensorKind, nbytes: int = 4096) -> int:
        tid = len(self.tensors)
        self.tensors.append(Tensor(id=tid, name=name, shape=(nbytes // 4,), dtype="float32",
                                   nbytes=nbytes, kind=kind, storage=tid))
        return tid

    def op(self, name: str, phase: Phase, category: OpCategory, inputs: list[int],
           out: str, kind: TensorKind, nbytes: int = 4096) -> int:
        tid = self.tensor(out, kind, nbytes)
        oid = len(self.ops)
        self.tensors[tid].producer = oid
        for i in inputs:
            self.tensors[i].consumers.append(oid)
        self.ops.append(Op(id=oid, name=name, target=f"aten.{name}", phase=phase,
                           category=category, inputs=inputs, outputs=[tid], flops=10.0,
                           bytes_touched=8192))
        return tid

    def graph(self, outputs: list[int]) -> Graph:
        g = Graph(tensors=self.tensors, ops=self.ops, outputs=outputs)
        g.validate()
        return g


def _names(graph: Graph, tids: list[int]) -> set[str]:
    return {graph.tensors[t].name for t in tids}


def _step() -> Graph:
    """x @ w -> a; gelu-like chain b = tanh(a), c = b * a; a residual r = a + d of two large
    values; the backward reads b, r and a (as a GELU and a norm backward would)."""
    A, G, IN = TensorKind.ACTIVATION, TensorKind.GRADIENT, TensorKind.INPUT
    s = _Builder()
    x, w, seed = s.tensor("x", IN), s.tensor("w", IN), s.tensor("tangent", TensorKind.TANGENT)
    a = s.op("mm", F, MM, [x, w], "a", A)
    d = s.op("mm2", F, MM, [x, w], "d", A)
    b = s.op("tanh", F, EW, [a], "b", A)
    c = s.op("mul", F, EW, [b, a], "c", A)
    r = s.op("add", F, EW, [a, d], "r", A)
    q = s.op("mul2", F, EW, [c, r], "q", A)
    loss = s.op("sum", F, RED, [q], "loss", TensorKind.OUTPUT, 4)
    g1 = s.op("mul_b", B, EW, [seed, b], "g1", G)
    g2 = s.op("mul_r", B, EW, [g1, r], "g2", G)
    g3 = s.op("mm_b", B, MM, [g2, x], "gw", G)
    return s.graph([loss, g3])


def test_a_forward_chain_is_read_from_its_roots_and_single_use_values_are_absorbed():
    graph = _step()
    fused = fuse_elementwise(graph)
    g = fused.graph
    names = {t.name for t in g.tensors}
    # b is recomputed inside the backward kernel from a (one value, its size): no backward
    # op reads b any more; r needs two values as large as itself: it stays read
    backward_reads = {g.tensors[t].name for op in g.ops if op.phase is Phase.BACKWARD
                      for t in op.inputs}
    assert "b" not in backward_reads and {"a", "r"} <= backward_reads
    # b (now read by the forward's mul only), c and q are read once by a point-wise op or a
    # reduction of their half: absorbed; g1 too (read by the backward's point-wise mul_r);
    # g2 feeds a matmul and r two ops: they stay
    assert {"b", "c", "q", "g1"}.isdisjoint(names) and {"a", "r", "g2", "gw"} <= names
    assert fused.absorbed == 4
    assert {t.name for t in g.activations()} == {"a", "r"}
    # ids map back to the original graph's tensors, names and all
    for new, old in enumerate(fused.original):
        assert g.tensors[new].name == graph.tensors[old].name
    # the merged ops carry their members' flops (mul_r also the inlined tanh's)
    sums = {g.ops[n].name: sum(graph.ops[m].flops for m in ms) for n, ms in fused.merged.items()}
    assert sums["sum"] == 40.0  # tanh, mul, mul2, sum
    mul_r = next(op for op in g.ops if op.name == "mul_r")
    assert mul_r.flops == 30.0  # mul_b, mul_r and the tanh recomputed inline
    assert graph.tensors[2].name == "tangent" and len(graph.ops) == 10  # input unchanged


def test_the_measured_scratch_per_op_follows_the_fused_ops():
    """``graph.meta``'s per-op lists (filled on the unfused graph) are mapped onto the
    fused ops (the scratch: the largest of each op's members), so the activation scope reads it as
    measured (copied as it was, its length mismatched and the scope charged every
    gradient-making kernel its temporaries plus the gradient's bytes: ResNet-18 planned
    9 MiB high, session 17)."""
    from outcore.plan.scope import SCRATCH

    graph = _step()
    graph.meta[SCRATCH] = [100 * (i + 1) for i in range(len(graph.ops))]
    graph.meta["module_paths"] = [f"layer.{op.name}" for op in graph.ops]
    fused = fuse_elementwise(graph)
    scratch, paths = fused.graph.meta[SCRATCH], fused.graph.meta["module_paths"]
    assert len(scratch) == len(paths) == len(fused.graph.ops) < len(graph.ops)
    for nid, members in fused.merged.items():
        assert scratch[nid] == max(100 * (m + 1) for m in members)
        assert paths[nid] == f"layer.{fused.graph.ops[nid].name}"  # the op kept
    graph.meta[SCRATCH] = [1, 2]  # describes no op of this graph: not carried over
    assert SCRATCH not in fuse_elementwise(graph).graph.meta
    assert len(graph.meta[SCRATCH]) == 2  # the input graph's meta is unchanged


def test_nothing_fuses_across_a_graph_output_a_view_or_a_random_op():
    A = TensorKind.ACTIVATION
    s = _Builder()
    x = s.tensor("x", TensorKind.INPUT)
    a = s.op("exp", F, EW, [x], "a", A)
    b = s.op("neg", F, EW, [a], "b", A)
    s.ops[-1].random = True
    c = s.op("sum", F, RED, [b], "c", TensorKind.OUTPUT, 4)
    graph = s.graph([a, c])
    fused = fuse_elementwise(graph)
    assert fused.absorbed == 0  # a is an output; b's reader is fine but b's producer random
    assert len(fused.graph.ops) == 3


def _shared(first: str = "div", reads: int = 1) -> Graph:
    """The backward of a pooled head: g = mm(seed, w) (small); e = div(g, h) is read by two
    reductions and a point-wise op of the backward, each a kernel of its own; ``reads``
    extra inputs of e's producer."""
    A, G, IN = TensorKind.ACTIVATION, TensorKind.GRADIENT, TensorKind.INPUT
    s = _Builder()
    x, w, seed = s.tensor("x", IN), s.tensor("w", IN), s.tensor("tangent", TensorKind.TANGENT)
    h = s.op("conv", F, MM, [x, w], "h", A, 65536)
    loss = s.op("sum", F, RED, [h], "loss", TensorKind.OUTPUT, 4)
    g = s.op("mm", B, MM, [seed, w], "g", G, 512)
    extra = [s.tensor(f"r{i}", IN) for i in range(reads - 1)]
    e = s.op(first, B, EW, [g, h, *extra], "e", G, 65536)
    s1 = s.op("sum1", B, RED, [e], "s1", G, 64)
    s2 = s.op("sum2", B, RED, [e, h], "s2", G, 64)
    m = s.op("mul", B, EW, [e, s1, s2], "m", G, 65536)
    gx = s.op("mm_x", B, MM, [m, w], "gx", G)
    return s.graph([loss, gx])


def test_a_light_value_several_kernels_read_is_inlined_into_each_and_its_inputs_live_on():
    """Inductor inlines a point-wise value read by several nodes into each (``mark_reuse``
    realizes it only for a heavy op, a large body or more than 4 reads): its inputs are
    read by its last reader. Planned materialised, the 512 B gradient of a convolution
    network's pooled features was freed before the compiled step's peak, which it was not
    (tests/compiled/test_inductor_conv.py measured 512 B above the plan)."""
    fused = fuse_elementwise(_shared())
    g = fused.graph
    assert "e" not in {t.name for t in g.tensors}
    readers = {g.ops[c].name for t in g.tensors if t.name == "g" for c in t.consumers}
    assert readers == {"sum1", "sum2", "mul"}  # g lives until mul, e's last reader
    mul = next(op for op in g.ops if op.name == "mul")
    assert _names(g, mul.inputs) == {"g", "h", "s1", "s2"} and mul.flops == 20.0
    assert not any(op.name == "div" for op in g.ops)
    for heavy in ("exp", "tanh"):  # realized on reuse: read by its readers, g freed early
        g2 = fuse_elementwise(_shared(first=heavy)).graph
        assert "e" in {t.name for t in g2.tensors}
        assert {g2.ops[c].name for t in g2.tensors if t.name == "g" for c in t.consumers} \
            == {heavy}
    many = fuse_elementwise(_shared(reads=4)).graph  # g, h and 3 more: 5 reads
    assert "e" in {t.name for t in many.tensors}
    assert "e" not in {t.name for t in fuse_elementwise(_shared(reads=3)).graph.tensors}
