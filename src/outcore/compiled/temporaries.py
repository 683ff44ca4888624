"""Kernel temporaries of the library kernels an Inductor graph calls, measured per op.

Inductor generates its own code for point-wise ops, reductions and the rest of a decomposed
graph: those kernels allocate nothing beyond their outputs. Convolutions (forward and
backward), matrix products and attention it calls as library kernels ("extern kernels"),
and these allocate scratch of their own (mkldnn's converted weights and column buffers in a
convolution backward, say) that a count of tensors does not see. ``measure_extern(graph,
nodes)`` runs each such op of the joint graph alone, on inputs laid out like its arguments,
under the CPU allocator's profiler (``outcore.cost.measure_temporaries``' method), and writes
the bytes it held beyond what it returned to ``op.temporaries``: the memory rule holds them
during each Compute of the op, so the plan's predicted peak counts them.

Invariant: only ops of ``EXTERN`` categories are run and changed; every other op's
``temporaries`` is left as it was (0 from ``build_graph``). The ops run on real tensors even
when the caller holds a FakeTensorMode (Inductor's partitioner does).
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from outcore.capture.convert import NodeMap
from outcore.cost.measure_temporaries import _profiled, _run_alone
from outcore.graph.ir import Graph, OpCategory
from outcore.plan.scope import SCRATCH

#: Op families Inductor runs as library kernels (with scratch of their own).
EXTERN = (OpCategory.CONV, OpCategory.MATMUL, OpCategory.ATTENTION)


def measure_extern(graph: Graph, nodes: NodeMap, *, seed: int = 0) -> int:
    """Measure and set the temporaries of ``graph``'s ``EXTERN`` ops (module docstring);
    ``nodes`` is ``build_graph``'s map of the same graph. Returns how many ops were run."""
    chosen = [(op, node) for op, node in zip(graph.ops, nodes.op_nodes, strict=True)
              if op.category in EXTERN]
    if not chosen:
        return 0
    fx_nodes = [node for _, node in chosen]
    # the partitioner runs under the joint graph's FakeTensorMode: the ops must run on real
    # tensors, outside it (under it every input and output was fake and nothing measured)
    with unset_fake_temporarily(), torch.no_grad(), torch.random.fork_rng(devices=[]):
        _run_alone(fx_nodes, seed)  # warm up: lazy initialisations are not temporaries
        measured, scratch = _profiled(lambda: _run_alone(fx_nodes, seed), len(fx_nodes))
    held = [0] * len(graph.ops)  # each op's scratch (``plan.scope.SCRATCH``)
    for (op, _), nbytes, extra in zip(chosen, measured, scratch, strict=True):
        op.temporaries = int(nbytes)
        held[op.id] = int(extra)
    graph.meta[SCRATCH] = held
    return len(chosen)
