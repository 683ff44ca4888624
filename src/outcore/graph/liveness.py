"""Liveness over an execution order (plain Python).

A storage is live from the step its first tensor is produced until the last step that reads
any tensor of it; static storages (parameters, buffers, inputs, tangent) and the step's
outputs stay live for the whole step; a storage nobody reads is live only at the step that
makes it. ``memory_per_step`` is the device memory after each op when every tensor is freed
at its last use: it equals the memory curve of the ``liveness`` policy's schedule, sampled
at its Compute instructions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from outcore.graph.ir import STATIC_KINDS, Graph


@dataclass(frozen=True)
class Interval:
    """Positions in the order (inclusive) over which a storage is live."""

    first: int
    last: int


def tensor_uses(graph: Graph, order: Sequence[int]) -> dict[int, tuple[int, int]]:
    """Tensor id -> (position of its producer, position of its last reader).

    Static tensors start at -1; a tensor nobody reads has last == first.
    """
    position = {op: i for i, op in enumerate(order)}
    uses: dict[int, tuple[int, int]] = {}
    for t in graph.tensors:
        first = -1 if t.producer is None else position[t.producer]
        last = max((position[c] for c in t.consumers), default=first)
        uses[t.id] = (first, last)
    return uses


def storage_intervals(graph: Graph, order: Sequence[int]) -> dict[int, Interval]:
    """Storage id -> the interval over which its memory is held."""
    end = len(order) - 1
    outputs = set(graph.outputs)
    intervals: dict[int, Interval] = {}
    for tid, (first, last_use) in tensor_uses(graph, order).items():
        t = graph.tensors[tid]
        last = end if t.kind in STATIC_KINDS or tid in outputs else last_use
        prev = intervals.get(t.storage)
        if prev is None:
            intervals[t.storage] = Interval(first, last)
        else:
            intervals[t.storage] = Interval(min(prev.first, first), max(prev.last, last))
    return intervals


def memory_per_step(graph: Graph, order: Sequence[int] | None = None) -> list[int]:
    """Device bytes live after each op of ``order`` under free-at-last-use."""
    order = list(order) if order is not None else [op.id for op in graph.ops]
    delta = [0] * (len(order) + 1)
    static = 0
    for storage, iv in storage_intervals(graph, order).items():
        nbytes = graph.tensors[storage].nbytes
        if iv.first < 0:
            static += nbytes
            continue
        delta[iv.first] += nbytes
        delta[iv.last + 1] -= nbytes
    curve, live = [], static
    for i in range(len(order)):
        live += delta[i]
        curve.append(live)
    return curve
