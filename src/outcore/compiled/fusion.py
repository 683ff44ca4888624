"""The joint graph as Inductor runs it: element-wise chains fused into their consumer.

outcore's IR has one op per ATen call of the decomposed joint graph, and every value is a
buffer. Inductor does not run it that way: a point-wise op whose value is read once, by a
point-wise op or a reduction of the same graph half, is inlined into that consumer's kernel
and never materialised. Planned op by op, the decomposed graph overstates both what the
backward holds (a recomputed or backward element-wise value costs its full bytes) and what
recomputing costs (each element-wise op priced as a kernel of its own), so the lowest
recompute-only plan keeps more at the forward/backward cut than Inductor needs.

``fuse_elementwise(graph)`` contracts the graph the way Inductor's inlining does, and the
planner plans the contracted graph. Invariants:

* A tensor is *absorbed* (removed, with its producer merged into its consumer) only when:
  its producer is an element-wise op with that single output, not random; it is a base
  tensor no view aliases; it is an activation or a gradient, not a graph output; and it has
  exactly one consumer op, element-wise or a reduction, not random, of the same phase.
  Everything else keeps its bytes: whatever Inductor may still inline beyond this rule
  (values read by several kernels) is planned as materialised, so the rule errs towards
  more memory, never less.
* An absorbed tensor is read by one op of its own phase only, so no other op, and in
  particular no backward op, reads it: the plan can never keep it at the cut, and the
  contracted graph's kept tensors are all FX nodes of the joint graph.
* A merged op stands where its last member (the one whose outputs survive) stood, reads
  the group's external inputs, flops are the members' sum, and bytes touched are what one
  fused kernel moves: each external input once and the outputs.
* Backward inlining never goes through an op of ``draws`` (an inline random draw: on the
  CPU Inductor's generator costs far more per element than reading a one-byte mask), so a
  dropout mask the backward reads stays a value the plan keeps or recomputes.
* Tensor ids are renumbered; ``Fused.original[new_id]`` is the tensor's id in the graph
  ``build_graph`` made (the ids ``NodeMap`` speaks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from outcore.graph.dtypes import itemsize
from outcore.graph.ir import STATIC_KINDS, Graph, Op, OpCategory, Phase, Tensor, TensorKind

#: Consumers Inductor inlines a point-wise producer into.
_INLINES_INTO = (OpCategory.ELEMENTWISE, OpCategory.REDUCTION)


@dataclass
class Fused:
    """The contracted graph and how its ids map back (module docstring)."""

    graph: Graph
    original: list[int]  # new tensor id -> id in the graph that was contracted
    absorbed: int = 0  # tensors that no longer materialise
    merged: dict[int, list[int]] = field(default_factory=dict)  # new op id -> old op ids


def _element_bytes(t: Tensor) -> int:
    """Bytes of the elements ``t`` itself spans (a view's too, unlike ``nbytes``)."""
    return math.prod(t.shape) * itemsize(t.dtype)


class _Wiring:
    """Each op's inputs after backward inlining, the flops inlined into it, and each
    tensor's reading ops (the graph itself is left as it is)."""

    def __init__(self, graph: Graph, draws: frozenset[int] = frozenset()) -> None:
        self.graph = graph
        self.draws = draws
        self.viewed = {t.storage for t in graph.tensors if t.is_view}
        self.outputs = set(graph.outputs)
        self.inputs = {op.id: list(op.inputs) for op in graph.ops}
        self.extra_flops = {op.id: 0.0 for op in graph.ops}
        self._roots: dict[int, tuple[frozenset[int], frozenset[int]]] = {}
        self._find_roots()
        for op in graph.ops:
            if op.phase is Phase.BACKWARD and op.category in _INLINES_INTO and not op.random:
                self._inline(op)
        self.readers: dict[int, set[int]] = {t.id: set() for t in graph.tensors}
        for oid, tids in self.inputs.items():
            for tid in tids:
                self.readers[tid].add(oid)

    def _pointwise(self, tid: int, phase: Phase | None = None) -> Op | None:
        """The producer of ``tid`` when it is a point-wise op Inductor may inline."""
        t = self.graph.tensors[tid]
        if t.producer is None or t.is_view or tid in self.viewed or tid in self.outputs \
                or t.kind not in (TensorKind.ACTIVATION, TensorKind.GRADIENT):
            return None
        op = self.graph.ops[t.producer]
        if op.category is not OpCategory.ELEMENTWISE or op.random or len(op.outputs) != 1 \
                or (phase is not None and op.phase is not phase):
            return None
        return op

    def roots(self, tid: int) -> tuple[frozenset[int], frozenset[int]]:
        """(the tensors a backward kernel reads to recompute forward value ``tid`` inline,
        the ops it recomputes): ``tid`` itself, and no op, unless ``tid`` is a forward
        point-wise value whose recompute needs at most ``tid``'s bytes of other forward
        values (module docstring)."""
        return self._roots.get(tid, (frozenset([tid]), frozenset()))

    def _find_roots(self) -> None:
        """``roots`` of every forward point-wise value, in the graph's (topological) order."""
        for op in self.graph.ops:
            if op.phase is not Phase.FORWARD or len(op.outputs) != 1 \
                    or self._pointwise(op.outputs[0], Phase.FORWARD) is None:
                continue
            tid = op.outputs[0]
            parts = [self.roots(i) for i in op.inputs]
            if op.id in self.draws or any(o in self.draws for _, chain in parts for o in chain):
                continue  # re-drawing costs more than reading the value: a buffer of its own
            reads = frozenset().union(*(r for r, _ in parts))
            own = self.graph.tensors[tid].nbytes
            big = [self.graph.storage_bytes(r) for r in reads
                   if self.graph.tensors[r].kind not in STATIC_KINDS
                   and 4 * self.graph.storage_bytes(r) >= own]
            if len(big) <= 1 and sum(big) <= own:
                self._roots[tid] = (reads, frozenset([op.id]).union(*(o for _, o in parts)))

    def _inline(self, op: Op) -> None:
        """Backward ``op`` reads the roots of each forward point-wise input instead."""
        reads: list[int] = []
        ops: set[int] = set()
        for tid in op.inputs:
            roots, chain = self.roots(tid)
            reads.extend(sorted(roots))
            ops |= chain
        self.inputs[op.id] = list(dict.fromkeys(reads))
        self.extra_flops[op.id] = sum(self.graph.ops[o].flops for o in ops)

    def absorber(self, tid: int) -> int | None:
        """The op that absorbs tensor ``tid``'s producer within its phase, or None."""
        producer = self._pointwise(tid)
        readers = self.readers[tid]
        if producer is None or len(readers) != 1:
            return None
        consumer = self.graph.ops[next(iter(readers))]
        if consumer.category not in _INLINES_INTO or consumer.random \
                or consumer.phase is not producer.phase:
            return None
        return consumer.id


def _groups(wiring: _Wiring) -> tuple[dict[int, int], set[int]]:
    """Each op's group root (the op its outputs are fused into, transitively), and the
    absorbed tensor ids."""
    graph = wiring.graph
    into: dict[int, int] = {}
    absorbed: set[int] = set()
    for op in graph.ops:
        if len(op.outputs) == 1:
            consumer = wiring.absorber(op.outputs[0])
            if consumer is not None:
                into[op.id] = consumer
                absorbed.add(op.outputs[0])
    root: dict[int, int] = {}
    for op in reversed(graph.ops):  # consumers come later: their roots are known first
        root[op.id] = root[into[op.id]] if op.id in into else op.id
    return root, absorbed


#: Inductor's ``realize_reads_threshold``: a point-wise value read by several kernels is
#: inlined into each unless its loop body reads more buffers than this (``mark_reuse``).
_REUSE_READS = 4
#: Ops Inductor's CPU heuristic realizes a reused value for (``should_realize_on_reuse``).
_HEAVY = frozenset({"exp", "log", "log10", "log1p", "log2", "sigmoid", "tanh"})
#: Members of a group past which its loop body is taken as large (realized): Inductor's
#: ``realize_opcount_threshold`` is 30 loop-body operations, one ATen op being one or more.
_LARGE_GROUP = 10


def _aten_name(target: str) -> str:
    """``"exp"`` of ``"aten.exp.default"`` (the target itself where it is no ATen op's)."""
    parts = target.split(".")
    return parts[1] if len(parts) >= 2 and parts[0] == "aten" else target


def _shared_inputs(wiring: _Wiring, root: dict[int, int], tid: int) -> list[int] | None:
    """The tensors each reader of ``tid`` reads instead of it when Inductor inlines its
    producer's kernel into every reader (``_inline_shared``), or None where it does not."""
    graph = wiring.graph
    producer = wiring._pointwise(tid)
    readers = wiring.readers[tid]
    if producer is None or root[producer.id] != producer.id or len(readers) < 2:
        return None
    for r in readers:
        op = graph.ops[r]
        if op.category not in _INLINES_INTO or op.random or op.phase is not producer.phase:
            return None
    group = [m for m in graph.ops[:producer.id + 1] if root[m.id] == producer.id]
    if len(group) > _LARGE_GROUP or any(m.id in wiring.draws or m.random
                                       or _aten_name(m.target) in _HEAVY for m in group):
        return None
    inside = {t for m in group for t in m.outputs}
    reads = list(dict.fromkeys(t for m in group for t in wiring.inputs[m.id] if t not in inside))
    return reads if len(reads) <= _REUSE_READS else None


def _inline_shared(wiring: _Wiring, root: dict[int, int], absorbed: set[int]) -> None:
    """Inline each point-wise value that several kernels of its phase read into all of
    them, as Inductor's lowering does (``mark_reuse``: a value read by several nodes is
    realized only when its loop body reads more than ``_REUSE_READS`` buffers, is large or
    computes a heavy op): the value is absorbed, its group dropped (``root`` -1), and each
    reader reads the group's inputs and adds its flops. Its inputs then live until its last
    reader, as in Inductor's kernels; planned materialised, the plan freed them after the
    value's producer and the compiled step held them past the plan's peak (the pooled
    features' gradient of a ResNet's backward, held to the last kernel reading the
    ReLU's gradient). In graph order, so a value read by a shared one is already replaced
    by its own inputs."""
    graph = wiring.graph
    for op in graph.ops:
        if len(op.outputs) != 1 or root[op.id] != op.id:
            continue
        tid = op.outputs[0]
        reads = _shared_inputs(wiring, root, tid)
        if reads is None:
            continue
        group = [m.id for m in graph.ops[:op.id + 1] if root[m.id] == op.id]
        flops = sum(graph.ops[m].flops + wiring.extra_flops[m] for m in group)
        for r in wiring.readers[tid]:
            wiring.inputs[r] = list(dict.fromkeys(
                x for t in wiring.inputs[r] for x in (reads if t == tid else [t])))
            wiring.extra_flops[r] += flops
        for t in reads:
            wiring.readers[t] |= wiring.readers[tid]
        for m in group:
            root[m] = -1
        absorbed.add(tid)


def fuse_elementwise(graph: Graph, draws: frozenset[int] = frozenset()) -> Fused:
    """``graph`` contracted as Inductor fuses it (module docstring); ``graph`` is unchanged.
    ``draws``: ops that draw random numbers inline (Inductor's seeded random ops, planned as
    point-wise): a backward op never reads a value through them (no backward inlining of a
    chain that holds one), so the plan decides whether such a value, a dropout mask, is
    kept or re-drawn."""
    wiring = _Wiring(graph, draws)
    root, absorbed = _groups(wiring)
    _inline_shared(wiring, root, absorbed)
    members: dict[int, list[int]] = {}
    for op in graph.ops:
        members.setdefault(root[op.id], []).append(op.id)
    original = [t.id for t in graph.tensors if t.id not in absorbed]
    new_id = {old: new for new, old in enumerate(original)}
    tensors = [Tensor(id=new_id[t.id], name=t.name, shape=t.shape, dtype=t.dtype,
                      nbytes=t.nbytes, kind=t.kind, storage=new_id[t.storage],
                      source=t.source, host=t.host)
               for t in graph.tensors if t.id not in absorbed]
    ops: list[Op] = []
    merged: dict[int, list[int]] = {}
    for op in graph.ops:
        if root[op.id] != op.id:
            continue  # merged into a later op
        group = [graph.ops[m] for m in members[op.id]]
        inside = {tid for m in group for tid in m.outputs}
        inputs = list(dict.fromkeys(tid for m in group for tid in wiring.inputs[m.id]
                                    if tid not in inside))
        nid = len(ops)
        merged[nid] = [m.id for m in group]
        ops.append(Op(
            id=nid, name=op.name, target=op.target, phase=op.phase, category=op.category,
            inputs=[new_id[t] for t in inputs], outputs=[new_id[t] for t in op.outputs],
            flops=sum(m.flops + wiring.extra_flops[m.id] for m in group),
            bytes_touched=(op.bytes_touched if inputs == op.inputs else
                           sum(_element_bytes(graph.tensors[t]) for t in [*inputs, *op.outputs])),
            random=any(m.random for m in group), variant=op.variant,
            variant_options=op.variant_options if len(group) == 1 else {},
            temporaries=max(m.temporaries for m in group)))
    for op in ops:
        for tid in op.outputs:
            tensors[tid].producer = op.id
        for tid in op.inputs:
            tensors[tid].consumers.append(op.id)
    fused = Graph(tensors=tensors, ops=ops, outputs=[new_id[t] for t in graph.outputs],
                  name=graph.name, meta=_fused_meta(graph, merged), source=graph.source)
    fused.validate()
    return Fused(fused, original, absorbed=len(absorbed), merged=merged)


def _fused_meta(graph: Graph, merged: dict[int, list[int]]) -> dict[str, Any]:
    """``graph.meta`` for the fused graph, its per-op lists mapped onto the fused ops so
    each keeps one entry per op of the graph it describes: the measured kernel scratch
    (``outcore.plan.scope.SCRATCH``) the largest of each op's members' (as
    ``temporaries``), the module paths (``"module_paths"``) the path of the op the others
    merged into (the last member). A list of another length than ``graph.ops`` describes no
    op of this graph and is dropped."""
    from outcore.plan.scope import SCRATCH

    meta = dict(graph.meta)
    fused_ops = sorted(merged)
    for key, pick in ((SCRATCH, lambda xs: max(int(x) for x in xs)),
                      ("module_paths", lambda xs: xs[-1])):
        per_op = meta.pop(key, None)
        if isinstance(per_op, list) and len(per_op) == len(graph.ops):
            meta[key] = [pick([per_op[m] for m in merged[nid]]) for nid in fused_ops]
    return meta
