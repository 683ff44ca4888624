"""Which forward tensors a compiled backward receives: outcore's kept set, mapped onto FX.

torch-free planning facts (what the schedule keeps at the forward/backward cut) are turned
into FX nodes of aot_autograd's joint graph here. Invariants:

* ``kept_at_cut(planned)`` is exactly the set of tensors resident when the schedule's forward
  half ends: the split executor (``outcore.runtime.split``) carries that same set from its
  forward to its backward half.
* ``saved_nodes`` returns the plan's kept forward nodes, plus only *forced* nodes: forward
  nodes the backward needs that cannot be recomputed there (an RNG draw such as
  ``inductor_seeds``, an op that mutates, a node torch tags MUST_SAVE). A forced node is
  never chosen by size; it is reported so the user sees every byte outside the plan.
* Whatever the backward needs and is neither saved nor forced is recomputed by the backward
  graph from saved nodes (any depth), as the plan recomputes it.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch
from torch import fx
from torch.utils.checkpoint import CheckpointPolicy

from outcore.capture.convert import NodeMap
from outcore.graph.ir import Graph, TensorKind
from outcore.plan.residency import Replay, no_workspace
from outcore.planned import PlannedStep
from outcore.runtime.split import split_point


def kept_at_cut(planned: PlannedStep) -> set[int]:
    """Tensor ids resident when the schedule's forward half ends (module docstring)."""
    cut = split_point(planned.graph, planned.schedule)
    replay = Replay(planned.graph, planned.schedule, no_workspace)
    steps = iter(replay)
    next(steps)  # the static tensors made resident before the first instruction
    for _ in range(cut):
        next(steps)
    return set(replay.resident_tensors())


def is_forced(node: fx.Node) -> bool:
    """True for a forward node the backward may not recompute: an RNG draw (it would draw
    again), a mutating op, or one torch tagged MUST_SAVE (collectives, effectful ops)."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload) and (
            torch.Tag.nondeterministic_seeded in target.tags or target._schema.is_mutable):
        return True
    return node.meta.get("recompute") is CheckpointPolicy.MUST_SAVE \
        or node.meta.get("partitioner_tag") == "must_be_in_forward"


def _tuple_source(node: fx.Node) -> fx.Node | None:
    """The op of which ``node`` is one output (``getitem``) when that op returns several
    (``native_dropout`` under Inductor's ``fallback_random``): such an output is saved, not
    the tuple, which a graph cannot return; None for any other node."""
    if node.target is not operator.getitem or not isinstance(node.args[0], fx.Node):
        return None
    source = node.args[0]
    return source if isinstance(source.meta.get("val"), (tuple, list)) else None


@dataclass
class SavedSet:
    """The nodes passed from the forward to the backward graph, and why."""

    kept: list[fx.Node] = field(default_factory=list)  # the plan's kept set (forward nodes)
    forced: list[fx.Node] = field(default_factory=list)  # outside the plan (``is_forced``)
    primals: list[fx.Node] = field(default_factory=list)  # graph inputs: held anyway

    def nodes(self, order: dict[fx.Node, int]) -> list[fx.Node]:
        """Every saved node, in graph order."""
        return sorted({*self.kept, *self.forced, *self.primals}, key=order.__getitem__)


def saved_nodes(nodes: NodeMap, kept: set[int], forward: set[fx.Node],
                bwd_outputs: list[fx.Node]) -> SavedSet:
    """The saved set for ``kept`` (module docstring): walk back from the backward's outputs,
    stop at a kept forward node, a placeholder or a forced node, recompute the rest."""
    result = SavedSet()
    seen: set[fx.Node] = set()
    stack = [o for o in bwd_outputs if isinstance(o, fx.Node)]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if node.op == "placeholder":
            if str(node.target).startswith("primals"):
                result.primals.append(node)
            continue  # a tangent, or another input the backward receives anyway
        if node in forward:
            tid = nodes.node_tensors.get(node)
            source = _tuple_source(node)
            if source is not None:  # one output of an op returning several: save the output
                if nodes.node_tensors.get(source) in kept or tid in kept:
                    result.kept.append(node)
                    continue
                if is_forced(source):
                    result.forced.append(node)
                    continue
            if tid is not None and tid in kept:
                result.kept.append(node)
                continue
            if is_forced(node):
                result.forced.append(node)
                continue
        stack.extend(node.all_input_nodes)
    result.kept = _outputs_of_tuples(result.kept)
    result.forced = _outputs_of_tuples(result.forced)
    return result


def _outputs_of_tuples(saved: list[fx.Node]) -> list[fx.Node]:
    """``saved`` with each op that returns several values replaced by its ``getitem`` users
    (a graph returns tensors, not tuples)."""
    out: list[fx.Node] = []
    for node in saved:
        if isinstance(node.meta.get("val"), (tuple, list)):
            out.extend(u for u in node.users if u.target is operator.getitem)
        else:
            out.append(node)
    return list(dict.fromkeys(out))


def kept_names(graph: Graph, nodes: NodeMap, kept: set[int]) -> set[str]:
    """FX names of the plan's kept forward activations (not graph inputs nor outputs);
    ``graph`` and ``kept`` in the ids of ``build_graph``'s graph (``nodes``'s)."""
    by_tid = {tid: node.name for node, tid in nodes.node_tensors.items()}
    return {by_tid[t] for t in kept if t in by_tid
            and graph.tensors[t].kind is TensorKind.ACTIVATION}
