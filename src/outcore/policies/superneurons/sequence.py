"""SuperNeurons' compute sequence: liveness analysis plus cost-aware recomputation (plain Python).

The first of two passes that build a SuperNeurons schedule (the second, the unified tensor
pool, is ``superneurons.utp``). It produces Compute and Free instructions only, as if every
checkpoint tensor stayed on the device:

1. the forward ops in route order;
2. at the forward/backward boundary every dropped storage (``Segmentation.dropped``) and every
   view of a non-static storage stops being available (views are re-made on demand by their
   free view op, so no view pins a storage across the step);
3. the backward ops in route order; before each, every input that is not available is
   recomputed from its producer, recursively, down to checkpoint or static tensors
   (``Compute(op, recompute=True)``; a recompute re-makes every output of its op). After the
   backward op, the tensors recomputed for it whose segment is memory-centric stop being
   available, so the next backward op that needs them recomputes them again; speed-centric
   ones stay available until their last use;
4. liveness (Sec. 3.2): each residency of each tensor is freed right after its last reader
   (right after it is made when nothing reads it); static tensors and the step's outputs are
   never freed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from outcore.graph.ir import STATIC_KINDS, Graph, Phase
from outcore.plan.schedule import Compute, Free, Instruction
from outcore.policies.superneurons.config import Recompute
from outcore.policies.superneurons.segments import Segmentation


def _available_after_forward(graph: Graph, seg: Segmentation) -> set[int]:
    avail: set[int] = set()
    for t in graph.tensors:
        base = graph.tensors[t.storage]
        forward_made = t.producer is not None and graph.ops[t.producer].phase is Phase.FORWARD
        if base.kind in STATIC_KINDS or (forward_made and not t.is_view
                                         and t.storage not in seg.dropped):
            avail.add(t.id)
    return avail


def _ensure(graph: Graph, tid: int, avail: set[int], seq: list[Instruction],
            defs: dict[int, list[int]], made: list[int]) -> None:
    """Recompute ``tid`` (and what it needs) unless available; iterative post-order."""
    stack: list[tuple[int, bool]] = [(tid, False)]
    while stack:
        current, expanded = stack.pop()
        if current in avail:
            continue
        producer = graph.tensors[current].producer
        if producer is None:
            raise AssertionError(f"graph input {graph.tensors[current].name!r} is not available")
        op = graph.ops[producer]
        if not expanded:
            stack.append((current, True))
            stack.extend((i, False) for i in reversed(op.inputs) if i not in avail)
            continue
        for out in op.outputs:
            if out not in avail:
                avail.add(out)
                defs[out].append(len(seq))
                made.append(out)
        seq.append(Compute(op.id, recompute=True))


def compute_sequence(graph: Graph, order: Sequence[int], seg: Segmentation) -> list[Instruction]:
    """Steps 1-4 of the module docstring: Compute and Free instructions."""
    forward = [o for o in order if graph.ops[o].phase is Phase.FORWARD]
    backward = [o for o in order if graph.ops[o].phase is not Phase.FORWARD]
    seq: list[Instruction] = []
    defs: dict[int, list[int]] = defaultdict(list)
    for oid in forward:
        for out in graph.ops[oid].outputs:
            defs[out].append(len(seq))
        seq.append(Compute(oid))
    avail = _available_after_forward(graph, seg)
    memory_centric = {s for s in seg.dropped
                      if seg.strategy_of_storage(graph, s) is Recompute.MEMORY}
    for oid in backward:
        made: list[int] = []
        for tid in graph.ops[oid].inputs:
            _ensure(graph, tid, avail, seq, defs, made)
        for out in graph.ops[oid].outputs:
            defs[out].append(len(seq))
            avail.add(out)
        seq.append(Compute(oid))
        for tid in made:
            if graph.tensors[tid].storage in memory_centric:
                avail.discard(tid)
    return insert_frees(graph, seq, defs)


def insert_frees(graph: Graph, seq: list[Instruction],
                 defs: dict[int, list[int]]) -> list[Instruction]:
    """Free each residency of each tensor after its last reader (step 4)."""
    keep = set(graph.outputs) | {t.id for t in graph.tensors if t.kind in STATIC_KINDS}
    uses: dict[int, list[int]] = defaultdict(list)
    for i, ins in enumerate(seq):
        if isinstance(ins, Compute):
            for tid in graph.ops[ins.op].inputs:
                uses[tid].append(i)
    free_after: dict[int, list[int]] = defaultdict(list)
    for tid, starts in defs.items():
        bounds = [*starts, len(seq)]
        reads = uses.get(tid, [])
        k = 0
        for n, start in enumerate(starts):
            end = bounds[n + 1]
            if end == len(seq) and tid in keep:
                continue
            last = start
            while k < len(reads) and reads[k] < end:
                last = max(last, reads[k])
                k += 1
            free_after[last].append(tid)
    out: list[Instruction] = []
    for i, ins in enumerate(seq):
        out.append(ins)
        out.extend(Free(tid) for tid in sorted(free_after.get(i, [])))
    return out
