"""Baseline policies: the reference points every other policy is compared with.

* ``keep-all``: network-wide allocation, nothing is freed during the step (SuperNeurons'
  "baseline" peak, the sum of every tensor).
* ``liveness``: keep every activation, free each tensor at its last use (what eager
  PyTorch does).
* ``offload-all``: offload every activation that backward reads, prefetch it back.
* ``recompute-cheap``: drop the outputs of cheap ops (element-wise, dropout, norm, pool,
  concat) in forward and recompute them in backward.
"""

from __future__ import annotations

from outcore.graph.ir import Graph, OpCategory, TensorKind
from outcore.plan.plan import Decision, Plan

CHEAP = frozenset({OpCategory.ELEMENTWISE, OpCategory.DROPOUT, OpCategory.NORM,
                   OpCategory.POOL, OpCategory.CONCAT})


def movable_activations(graph: Graph) -> list[int]:
    """Base activations read in backward that a policy may offload or recompute."""
    return [t.id for t in graph.activations() if t.kind is not TensorKind.OUTPUT]


def keep_all(graph: Graph) -> Plan:
    """Nothing freed during the step: the network-wide allocation peak."""
    return Plan(policy="keep-all", free_at_last_use=False,
                reasons=dict.fromkeys(movable_activations(graph),
                                      "keep-all keeps every tensor for the whole step"))


def liveness(graph: Graph) -> Plan:
    """Keep every activation; free each tensor after its last use."""
    return Plan(policy="liveness",
                reasons=dict.fromkeys(movable_activations(graph),
                                      "kept; freed after its last use in backward"))


def offload_all(graph: Graph) -> Plan:
    """Offload every activation backward reads; prefetch it before its first backward use."""
    plan = Plan(policy="offload-all")
    for tid in movable_activations(graph):
        plan.decisions[tid] = Decision.OFFLOAD
        plan.reasons[tid] = ("offload-all offloads every activation read in backward "
                             f"({graph.tensors[tid].nbytes} B)")
    return plan


def recompute_cheap(graph: Graph) -> Plan:
    """Recompute outputs of cheap ops in backward; keep the rest."""
    plan = Plan(policy="recompute-cheap")
    for tid in movable_activations(graph):
        op = graph.producer_op(tid)
        if op.category in CHEAP:
            plan.decisions[tid] = Decision.RECOMPUTE
            plan.reasons[tid] = f"produced by a cheap {op.category} op ({op.target}): recompute"
        else:
            plan.reasons[tid] = f"produced by a {op.category} op ({op.target}): too costly, keep"
    return plan
