"""Cost-model binding, shared by the policies."""

from __future__ import annotations

from outcore.cost.model import CostModel
from outcore.graph.ir import Graph


def bound(graph: Graph, cost: CostModel) -> CostModel:
    """``cost`` bound to ``graph`` (``CostModel.bind``: per-op dtypes and shapes; a measured
    profile refuses another graph). Bind before pricing any op of ``graph``."""
    return cost.bind(graph)
