"""What an infeasible budget is told (issue 15, point 6): the lowest peak any plan of keep /
offload / recompute decisions reaches at this batch, and what would lower it.

``refusal(graph, exc, cost, can_split)`` returns ``exc`` re-worded: the policy's own verdict
(what it needed), then the floor of every plan (``lowest_peak``: what outcore-optimal's
model proves no plan goes below, every activation freed over its whole gap; never below
the layer-wise bound), its static part (parameters, buffers, inputs: no decision moves
them), and the ways out with estimates: ``k`` sub-batches and a batch of about ``n``, both
from scaling the non-static part of the floor with the batch (an estimate: gradients do not
shrink with the batch, so the real figures can be smaller). The returned error's
``required`` stays the policy's; ``lowest`` is the floor.
"""

from __future__ import annotations

import math
from typing import Any

from outcore.errors import InfeasibleBudgetError, OutcoreError
from outcore.graph.bounds import reference_peaks
from outcore.graph.ir import Graph
from outcore.units import format_bytes

#: ``graph.meta`` key of the floors found, per cost model (the floor ignores the budget)
_CACHE_KEY = "_outcore_lowest_peak"


def lowest_peak(graph: Graph, cost: Any) -> int:
    """The lowest peak any keep / offload / recompute plan of ``graph`` reaches (one
    sub-batch): ``outcore.policies.optimal.floor``, the figure outcore-optimal refuses a
    smaller budget with; at least the layer-wise lower bound. Cached per graph and cost
    model."""
    from outcore.policies.optimal import floor

    cache: dict[str, int] = graph.meta.setdefault(_CACHE_KEY, {})
    key = repr(cost)
    if key not in cache:
        cache[key] = max(floor(graph, cost), reference_peaks(graph).layer_lower_bound)
    return cache[key]


def batch_size(graph: Graph) -> int | None:
    """The graph's batch size, when its inputs say it (else None)."""
    from outcore.graph.batch_dims import graph_batch

    try:
        return int(graph_batch(graph, {}).size)
    except (OutcoreError, ValueError, AttributeError):
        return None


def ways_out(graph: Graph, budget: int, floor: int, can_split: bool) -> str:
    """The sentence naming the floor and what would lower it (module doc)."""
    static = reference_peaks(graph).static
    head = (f"No plan of keep/offload/recompute decisions peaks below {format_bytes(floor)} "
            f"at this batch ({format_bytes(static)} of it parameters, buffers and inputs, "
            "which no decision moves).")
    if budget <= static:
        return (f"{head} The static tensors alone exceed the budget: no plan or batch size "
                "fits; use a device with more memory, or a smaller model or precision.")
    if floor <= budget:
        return (f"Plans of keep/offload/recompute decisions reach down to "
                f"{format_bytes(floor)} at this batch, below this budget: this policy did not "
                "find one of them; policy='auto' runs every planner and keeps the fastest that "
                "fits.")
    scale = (floor - static) / (budget - static)
    parts = max(2, math.ceil(scale))
    batch = batch_size(graph)
    smaller = "shrink the batch"
    if batch is not None and batch > 1:
        smaller += f" to about {max(1, math.floor(batch / scale))} (from {batch})"
    split = (f"split the batch into about {parts} sub-batches (allow_sub_batches=True, CLI "
             "--allow-sub-batches; changes what BatchNorm computes)" if can_split else
             f"split the batch into about {parts} sub-batches (outcore.compile, or "
             "outcore.plan with recapture= and allow_sub_batches=True; changes what "
             "BatchNorm computes)")
    return (f"{head} To go lower: {split}, or {smaller}; estimates that scale the "
            "non-static bytes with the batch.")


def refusal(graph: Graph, exc: InfeasibleBudgetError, cost: Any,
            can_split: bool) -> InfeasibleBudgetError:
    """``exc`` with the floor of every plan and the ways out added (module doc)."""
    if getattr(exc, "lowest", None) is not None:
        return exc
    floor = lowest_peak(graph, cost) if cost is not None else \
        reference_peaks(graph).layer_lower_bound
    hint = f"{exc.hint} {ways_out(graph, exc.budget, floor, can_split)}".strip()
    out = InfeasibleBudgetError(exc.policy, exc.budget, exc.required, hint)
    out.lowest = floor
    return out
