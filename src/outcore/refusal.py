"""What an infeasible budget is told (issue 15, point 6): the lowest peak any plan of keep /
offload / recompute decisions on the activations reaches at this batch, and what would lower
it. (moDNN also offloads gradients made in the backward, so its plans can peak below that
floor: a GPT-2 of 2 layers at batch 16, 3.11 MB against the floor's 3.77 MB.)

``refusal(graph, exc, cost, can_split, opted_in=None)`` returns ``exc`` re-worded: the
policy's own verdict (what it needed), then the floor of every plan (``lowest_peak``: what
outcore-optimal's model proves no plan goes below, every activation freed over its whole
gap; never below the layer-wise bound), its static part (parameters, buffers, inputs: no
decision moves them), and the ways out with estimates: ``k`` sub-batches and a batch of
about ``n``, both from scaling the non-static part of the floor with the batch (an
estimate: gradients do not shrink with the batch, so the real figures can be smaller). The
returned error's ``required`` stays the policy's; ``lowest`` is the floor.

The sub-batch advice follows what the user already did: without the opt-in it names
``allow_sub_batches=True`` (where a re-capture is possible, ``can_split``) or
``outcore.compile``; with it (``opted_in``: the policy's name) it never asks for the opt-in
again, but names the policies that split (``SPLITTING_POLICIES``) when this one does not,
and only the smaller batch when it does (it split as far as it could).
"""

from __future__ import annotations

import math
from typing import Any

from outcore.errors import InfeasibleBudgetError, OutcoreError
from outcore.graph.bounds import reference_peaks
from outcore.graph.ir import Graph
from outcore.units import format_bytes

#: The policies that split the batch into sub-batches when the user opted in (they read
#: ``PolicyContext.recapture``): moDNN, and outcore-auto through moDNN's candidate.
SPLITTING_POLICIES = ("modnn", "outcore-auto")

#: ``graph.meta`` key of the floors found, per cost model (the floor ignores the budget)
_CACHE_KEY = "_outcore_lowest_peak"


def lowest_peak(graph: Graph, cost: Any) -> int:
    """The lowest peak any keep / offload / recompute plan of ``graph``'s activations reaches
    (one sub-batch): ``outcore.policies.optimal.floor``, the figure outcore-optimal refuses a
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


def ways_out(graph: Graph, budget: int, floor: int, can_split: bool,
             opted_in: str | None = None) -> str:
    """The sentence naming the floor and what would lower it (module doc); ``opted_in``:
    the policy's name when the user allowed sub-batches, else None."""
    static = reference_peaks(graph).static
    head = (f"No plan that keeps, offloads or recomputes activations peaks below "
            f"{format_bytes(floor)} at this batch ({format_bytes(static)} of it parameters, "
            "buffers and inputs, which no decision moves; moDNN's plans, which also offload "
            "gradients in the backward, are not bound by it).")
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
    if opted_in in SPLITTING_POLICIES:
        return (f"{head} To go lower: {smaller} (sub-batches were allowed and policy "
                f"{opted_in!r} splits as far as it can); an estimate that scales the "
                "non-static bytes with the batch.")
    split = _split_advice(parts, can_split, opted_in)
    return (f"{head} To go lower: {split}, or {smaller}; estimates that scale the "
            "non-static bytes with the batch.")


def _split_advice(parts: int, can_split: bool, opted_in: str | None) -> str:
    """How to split the batch into ``parts`` sub-batches, given what the user did."""
    if opted_in is not None:
        return (f"split the batch into about {parts} sub-batches: they are allowed "
                f"(allow_sub_batches=True), but policy {opted_in!r} never splits; "
                "policy='auto' or policy='modnn' splits it")
    if can_split:
        return (f"split the batch into about {parts} sub-batches (allow_sub_batches=True, "
                "CLI --allow-sub-batches; changes what BatchNorm computes)")
    return (f"split the batch into about {parts} sub-batches (outcore.compile, or "
            "outcore.plan with recapture= and allow_sub_batches=True; changes what "
            "BatchNorm computes)")


def refusal(graph: Graph, exc: InfeasibleBudgetError, cost: Any,
            can_split: bool, opted_in: str | None = None) -> InfeasibleBudgetError:
    """``exc`` with the floor of every plan and the ways out added (module doc);
    ``opted_in``: the policy's name when the user allowed sub-batches."""
    if getattr(exc, "lowest", None) is not None:
        return exc
    floor = lowest_peak(graph, cost) if cost is not None else \
        reference_peaks(graph).layer_lower_bound
    hint = f"{exc.hint} {ways_out(graph, exc.budget, floor, can_split, opted_in)}".strip()
    out = InfeasibleBudgetError(exc.policy, exc.budget, exc.required, hint)
    out.lowest = floor
    return out
