"""SuperNeurons' checkpoints, recomputation segments and the cost-aware choice (plain Python).

Paper (PPoPP'18 Sec. 3.3-3.4) and how it maps onto outcore's ATen-level graph:

* **Checkpoints** are the compute-intensive layers (CONV, FC): their forward results are
  kept (and, for CONV, managed by the unified tensor pool); every other layer's forward
  result is dropped and recomputed in backward. Here a checkpoint op is a forward op of
  category CONV, MATMUL or ATTENTION. Its *checkpoint tensor* is its output, or, when that
  output's only reader is an activation Caffe and Torch run in place (ReLU, sigmoid, tanh,
  ...; see ``common.layers``), that activation's output: in the paper the two share one
  buffer, here the conv output is a transient the activation consumes at once.
* **Offloaded tensors** (UTP): the checkpoint tensors of CONV ops ("we only offload the
  tensors from CONV layers"), plus the anchors below.
* **Segments.** Walking the forward route, each checkpoint op opens a segment; the ops that
  follow it up to the next checkpoint op belong to it. A segment is recomputed from the
  checkpoint tensors it reads.
* **Anchors.** A dropped tensor read in forward by a non-checkpoint op of *another* segment
  (a ResNet shortcut read by the next unit's join, an Inception branch read by the concat)
  is kept as a checkpoint tensor and offloaded like a CONV output. Without that, recomputing
  one segment would recompute every earlier unit through the shortcut chain; the paper's
  text does not say how its runtime handles joins.
* **Cost-aware recomputation** (Sec. 3.4): ``l_peak = max_i l_i`` over every op (its
  distinct non-static input and output bytes, ``outcore.graph.bounds.layer_bytes``). A
  segment's speed-centric memory cost is ``sum_i l_i^f + l^b_seg``: the bytes of the
  checkpoint tensors it reads plus every dropped tensor of it that backward needs (what
  speed-centric recomputation holds at once), plus the largest backward op that reads one of
  them. Segments whose cost is <= ``l_peak`` recompute speed-centric (once, results kept for
  the segment's backward), the others memory-centric (per backward op, results dropped right
  after it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from outcore.errors import PolicyOptionError
from outcore.graph.bounds import layer_bytes
from outcore.graph.ir import STATIC_KINDS, Graph, OpCategory, Phase
from outcore.policies.common.layers import through_activations
from outcore.policies.superneurons.config import Recompute

CHECKPOINT_CATEGORIES = frozenset({OpCategory.CONV, OpCategory.MATMUL, OpCategory.ATTENTION})

STRATEGIES = tuple(Recompute)  # "cost-aware", "speed", "memory", "none"


@dataclass
class Segment:
    """One recomputation segment: its forward ops, what backward needs of it, and the choice."""

    index: int
    ops: list[int]
    dropped: list[int] = field(default_factory=list)  # dropped storages backward needs
    sources: list[int] = field(default_factory=list)  # checkpoint storages it reads
    backward_bytes: int = 0  # l^b_seg
    strategy: Recompute = Recompute.SPEED  # SPEED or MEMORY, once chosen

    def speed_cost(self, graph: Graph) -> int:
        """``sum_i l_i^f + l^b_seg`` (see the module docstring)."""
        held = sum(graph.tensors[s].nbytes for s in self.dropped + self.sources)
        return held + self.backward_bytes


@dataclass
class Segmentation:
    """Checkpoints and segments of a graph under one execution route.

    ``checkpoints``: storages kept across forward and backward; ``offloadable``: those the
    tensor pool may offload (CONV checkpoint tensors and anchors); ``dropped``: forward
    storages released after their last forward use and recomputed when backward needs them;
    ``segment_of``: forward op id -> segment index (-1 before the first checkpoint op).
    """

    checkpoints: set[int]
    offloadable: set[int]
    anchors: set[int]
    dropped: set[int]
    segment_of: dict[int, int]
    segments: list[Segment]
    l_peak: int

    def strategy_of_storage(self, graph: Graph, storage: int) -> Recompute:
        producer = graph.tensors[storage].producer
        seg = self.segment_of.get(producer, -1) if producer is not None else -1
        return self.segments[seg].strategy if seg >= 0 else Recompute.SPEED


def checkpoint_tensor(graph: Graph, op_id: int) -> int:
    """The tensor a checkpoint op leaves (its output, or the in-place activation's output)."""
    return through_activations(graph, graph.ops[op_id].outputs[0])


def _is_static(graph: Graph, tid: int) -> bool:
    return graph.tensors[graph.tensors[tid].storage].kind in STATIC_KINDS


def _assign_segments(graph: Graph, forward: Sequence[int]) -> tuple[dict[int, int], list[int]]:
    segment_of: dict[int, int] = {}
    heads: list[int] = []
    current = -1
    for oid in forward:
        if graph.ops[oid].category in CHECKPOINT_CATEGORIES:
            current = len(heads)
            heads.append(oid)
        segment_of[oid] = current
    return segment_of, heads


def _anchors(graph: Graph, forward: Sequence[int], segment_of: dict[int, int],
             candidates: set[int]) -> set[int]:
    anchors: set[int] = set()
    for oid in forward:
        op = graph.ops[oid]
        if op.category in CHECKPOINT_CATEGORIES:
            continue
        for tid in op.inputs:
            storage = graph.tensors[tid].storage
            producer = graph.tensors[storage].producer
            if storage in candidates and producer is not None \
                    and segment_of.get(producer, -1) != segment_of[oid]:
                anchors.add(storage)
    return anchors


def _needed_dropped(graph: Graph, dropped: set[int]) -> set[int]:
    """Dropped storages a backward op reads, or that recomputing such a storage reads."""
    needed: set[int] = set()
    stack = [graph.tensors[t].storage for op in graph.ops if op.phase is not Phase.FORWARD
             for t in op.inputs if graph.tensors[t].storage in dropped]
    while stack:
        storage = stack.pop()
        if storage in needed:
            continue
        needed.add(storage)
        made_by = graph.tensors[storage].producer
        assert made_by is not None, "dropped storages are made in forward"
        producer = graph.ops[made_by]
        stack.extend(graph.tensors[t].storage for t in producer.inputs
                     if graph.tensors[t].storage in dropped)
    return needed


def segment(graph: Graph, order: Sequence[int],
            strategy: Recompute | str = Recompute.COST_AWARE,
            recompute: bool = True) -> Segmentation:
    """Checkpoints, segments and per-segment strategies (see the module docstring).

    ``strategy`` is a ``Recompute`` (or its string): cost-aware, speed or memory (every
    segment), or none (no recomputation: nothing is dropped; the same as
    ``recompute=False``). PolicyOptionError lists the strategies for any other value.
    """
    if strategy not in STRATEGIES:
        valid = ", ".join(repr(s.value) for s in STRATEGIES)
        raise PolicyOptionError(f"recompute strategy must be one of {valid}, got {strategy!r}",
                                valid)
    strategy = Recompute(strategy)
    recompute = recompute and strategy is not Recompute.NONE
    forward = [o for o in order if graph.ops[o].phase is Phase.FORWARD]
    segment_of, heads = _assign_segments(graph, forward)
    checkpoints = {graph.tensors[checkpoint_tensor(graph, h)].storage for h in heads}
    conv_points = {graph.tensors[checkpoint_tensor(graph, h)].storage for h in heads
                   if graph.ops[h].category is OpCategory.CONV}
    outputs = set(graph.outputs)
    made = {t.id for t in graph.tensors if not t.is_view and t.producer is not None
            and graph.ops[t.producer].phase is Phase.FORWARD and not _is_static(graph, t.id)
            and t.id not in outputs}
    anchors: set[int] = set()
    dropped: set[int] = set()
    if recompute:
        anchors = _anchors(graph, forward, segment_of, made - checkpoints)
        checkpoints |= anchors
        dropped = made - checkpoints
    segments = [Segment(i, []) for i in range(len(heads))]
    for oid in forward:
        if segment_of[oid] >= 0:
            segments[segment_of[oid]].ops.append(oid)
    l_peak = max((layer_bytes(graph, o.id) for o in graph.ops), default=0)
    _fill_costs(graph, segments, segment_of, _needed_dropped(graph, dropped), checkpoints)
    for seg in segments:
        if strategy in (Recompute.SPEED, Recompute.MEMORY):
            seg.strategy = strategy
        else:
            seg.strategy = (Recompute.SPEED if seg.speed_cost(graph) <= l_peak
                            else Recompute.MEMORY)
    return Segmentation(checkpoints, (conv_points | anchors) if recompute else conv_points,
                        anchors, dropped, segment_of, segments, l_peak)


def _fill_costs(graph: Graph, segments: list[Segment], segment_of: dict[int, int],
                needed: set[int], checkpoints: set[int]) -> None:
    for storage in sorted(needed):
        made_by = graph.tensors[storage].producer
        index = segment_of.get(made_by, -1) if made_by is not None else -1
        if index >= 0:
            segments[index].dropped.append(storage)
    owner = {s: i for i, seg in enumerate(segments) for s in seg.dropped}
    for seg in segments:
        reads = {graph.tensors[t].storage for o in seg.ops for t in graph.ops[o].inputs}
        seg.sources = sorted(reads & checkpoints)
    for op in graph.ops:
        if op.phase is Phase.FORWARD:
            continue
        touched = {owner[s] for s in (graph.tensors[t].storage for t in op.inputs) if s in owner}
        if touched:
            lb = layer_bytes(graph, op.id)
            for i in touched:
                segments[i].backward_bytes = max(segments[i].backward_bytes, lb)
