"""The three reference peaks of SuperNeurons §3 (plain Python).

* ``network_wide``: every tensor has its own memory for the whole step (no freeing):
  the static bytes plus the bytes of every storage the step makes.
* ``liveness``: the peak when each tensor is freed at its last use (``memory_per_step``).
* ``layer_lower_bound``: max over ops of l_i, the bytes an op needs at once (its distinct
  input and output storages), plus the static bytes, which must stay resident. No policy
  that runs op i on the device can go below it; SuperNeurons' recomputation reaches about
  max(l_i).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from outcore.graph.ir import STATIC_KINDS, Graph
from outcore.graph.liveness import memory_per_step


@dataclass(frozen=True)
class ReferencePeaks:
    network_wide: int
    liveness: int
    layer_lower_bound: int
    static: int
    worst_op: int  # the op id that sets the layer-wise bound


def layer_bytes(graph: Graph, op_id: int) -> int:
    """l_i: distinct non-static storage bytes among op ``op_id``'s inputs and outputs."""
    op = graph.ops[op_id]
    storages = {graph.tensors[t].storage for t in op.inputs + op.outputs}
    return sum(graph.tensors[s].nbytes for s in storages
               if graph.tensors[s].kind not in STATIC_KINDS)


def reference_peaks(graph: Graph, order: Sequence[int] | None = None) -> ReferencePeaks:
    """Compute the three peaks; ``order`` defaults to capture order."""
    static = graph.static_bytes()
    made = sum(t.nbytes for t in graph.tensors if t.kind not in STATIC_KINDS and not t.is_view)
    curve = memory_per_step(graph, order)
    worst = max(range(len(graph.ops)), key=lambda i: layer_bytes(graph, i), default=0)
    lb = static + (layer_bytes(graph, worst) if graph.ops else 0)
    return ReferencePeaks(network_wide=static + made, liveness=max(curve, default=static),
                          layer_lower_bound=lb, static=static, worst_op=worst)
