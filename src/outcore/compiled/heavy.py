"""Flops of the heavy ops (matrix products, convolutions) a compiled backward recomputes.

On a fused graph the cost of a recompute is its heavy ops: an element-wise op or a reduction
recomputed in the backward is one more pass over memory inside a fused kernel, a matrix
product is its full flops again. ``recomputed_heavy_flops`` counts the latter for any
forward/backward pair of FX graphs, so outcore's partition and Inductor's min-cut partition
are measured by the same rule (a forward node's name that the backward graph also computes
is a recompute; names are kept by ``_extract_fwd_bwd_modules`` for both partitioners).

Invariant: flops are torch's flop registry's (2 * multiply-adds) from the nodes' fake-tensor
shapes (``meta["val"]``), the same count capture gives an op; a node without shapes counts
0, never a guess.

``MinCutRecorder`` runs Inductor's own min-cut partitioner and records the same count.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import fx
from torch._inductor.custom_graph_pass import CustomPartitionerFn

from outcore.capture.convert import fx_flops

_aten = torch.ops.aten
#: The heavy targets counted: matrix products and convolutions.
_HEAVY_TARGETS = {_aten.mm.default, _aten.addmm.default, _aten.bmm.default,
                  _aten.baddbmm.default, _aten.convolution.default}


def _shaped(node: object) -> bool:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return isinstance(val, torch.Tensor) and all(isinstance(s, int) for s in val.shape)


def node_flops(node: fx.Node) -> int:
    """Flops of one heavy node (``_HEAVY_TARGETS``), by torch's flop registry as capture
    counts them (``capture.convert.fx_flops``); 0 for any other node and for a node whose
    output or tensor arguments have no concrete shape."""
    if node.target not in _HEAVY_TARGETS or not _shaped(node):
        return 0
    tensors = [a for a in node.args if isinstance(a, fx.Node)]
    if not all(_shaped(a) for a in tensors):
        return 0
    return int(fx_flops(node))


def recomputed_heavy_flops(forward: fx.GraphModule, backward: fx.GraphModule) -> int:
    """Flops of the heavy nodes the backward graph computes again (module docstring)."""
    return sum(node_flops(n) for n in recomputed_nodes(forward, backward))


def recomputed_nodes(forward: fx.GraphModule, backward: fx.GraphModule) -> Iterable[fx.Node]:
    """The backward's call nodes whose name is also a forward call node's."""
    fw_ops = {n.name for n in forward.graph.nodes if n.op == "call_function"}
    return [n for n in backward.graph.nodes if n.op == "call_function" and n.name in fw_ops]


class MinCutRecorder(CustomPartitionerFn):
    """Inductor's own min-cut partitioner, recording what each backward recomputes.

    Pass as ``torch.compile(model, options={"custom_partitioner_fn": recorder})``: the split
    is exactly ``min_cut_rematerialization_partition``'s (same arguments, including
    ``activation_memory_budget`` from functorch's config); ``heavy_flops`` and ``targets``
    get one entry per joint graph, measured as ``recomputed_heavy_flops`` measures outcore's
    partitions. ``uuid`` is unique per recorder, so Inductor's caches never hand back a
    graph partitioned without recording it."""

    def __init__(self) -> None:
        self.heavy_flops: list[int] = []
        self.targets: list[dict[str, int]] = []
        self._key = f"min-cut-recorder-{uuid.uuid4().hex}"

    def uuid(self) -> Any:
        return self._key

    def __call__(self, gm: fx.GraphModule, joint_inputs: Sequence[object],
                 **kwargs: Any) -> tuple[fx.GraphModule, fx.GraphModule]:
        from torch._functorch.partitioners import min_cut_rematerialization_partition

        fw, bw = min_cut_rematerialization_partition(gm, joint_inputs, **kwargs)
        redone = recomputed_nodes(fw, bw)
        self.heavy_flops.append(sum(node_flops(n) for n in redone))
        self.targets.append(dict(Counter(str(n.target) for n in redone)))
        return fw, bw
