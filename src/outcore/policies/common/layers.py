"""Paper layers on an ATen graph: in-place activations (plain Python; shared by the vDNN and
SuperNeurons policies).

Caffe and Torch run ReLU (and sigmoid, tanh, ...) in place: a CONV layer and the activation
after it share one buffer (vDNN Sec. II-B, footnote 1). outcore's graph is functional: the
activation writes a new tensor and the conv output becomes a transient that the activation
consumes at once. ``fuses_into_activation`` recognises that transient, and
``through_activations`` follows a tensor to the buffer the paper's layer would hold.
"""

from __future__ import annotations

from outcore.graph.ir import Graph, Phase

#: Activations Caffe and Torch compute in place.
INPLACE_ACTIVATIONS = frozenset({
    "aten.relu.default", "aten.threshold.default", "aten.leaky_relu.default",
    "aten.hardtanh.default", "aten.sigmoid.default", "aten.tanh.default", "aten.elu.default",
})


def _activation_after(graph: Graph, tid: int) -> int | None:
    """The output of the in-place activation that is ``tid``'s only reader, else None."""
    readers = graph.tensors[tid].consumers
    if len(readers) != 1 or graph.tensors[tid].is_view:
        return None
    nxt = graph.ops[readers[0]]
    if (nxt.phase is not Phase.FORWARD or nxt.target not in INPLACE_ACTIVATIONS
            or nxt.inputs != [tid] or len(nxt.outputs) != 1):
        return None
    return nxt.outputs[0]


def fuses_into_activation(graph: Graph, tid: int) -> bool:
    """True when ``tid``'s only reader is an in-place activation reading nothing else: in
    the paper's framework the two share one buffer."""
    return _activation_after(graph, tid) is not None


def through_activations(graph: Graph, tid: int) -> int:
    """``tid``, or the output of the chain of in-place activations it feeds."""
    while True:
        nxt = _activation_after(graph, tid)
        if nxt is None:
            return tid
        tid = nxt
