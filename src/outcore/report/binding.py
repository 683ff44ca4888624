"""Which instructions bind a plan's budget, and what each activation's decision costs and frees
there (issue 15, point 6), read from the one Schedule replay (``outcore.plan.residency``).

Definitions (each a function of the graph, the schedule, the budget and the simulation):

* **binding instructions**: those whose device bytes (the memory rule's sample, transients
  included) are within ``epsilon`` (a fraction of the budget, ``EPSILON`` by default) of the
  budget (``Binding.binds``). Lowering the budget by more than the slack of any of them
  needs another decision at it. When none is (the plan leaves more slack than that, or there
  is no budget), the instructions within ``epsilon`` of the peak stand in for them, and
  ``binds`` is False.
* **position** of instruction ``i``: the graph op of the first non-recompute ``Compute`` at or
  after ``i`` (the op that instruction serves; the last op for trailing instructions).
* a base activation **would be resident** at ``i`` if kept: its producer's position is at or
  before ``i``'s and the last reader of its storage at or after it (free-at-last-use).
* the **bytes it frees** at a binding instruction: its storage's bytes when it would be
  resident there if kept but the replay has its storage off the device there; else 0. A kept
  activation frees nothing; a moved one frees its bytes only where its move is in effect.
* its **cost** (seconds, from the simulation's per-instruction timeline): a recompute's
  kernel time (every recompute ``Compute`` of its producer; an op with several recomputed
  outputs counts for each), an offload's stall of the compute stream at its Waits (the
  copy time the compute could not hide; ``copy_s`` is the whole copy time, on the copy
  engines); 0 for a kept one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from outcore.graph.ir import Graph
from outcore.graph.liveness import storage_intervals
from outcore.plan.residency import NONE, residency_steps
from outcore.plan.schedule import Compute, Offload, Prefetch, Schedule, Wait

#: Default closeness to the budget (fraction of it) for an instruction to bind.
EPSILON = 0.01


@dataclass(frozen=True)
class BindingInstruction:
    """An instruction whose device bytes are within epsilon of the budget (or the peak)."""

    index: int
    instruction: str  # e.g. "Compute layer3.0.conv2 (convolution)"
    device: int  # device bytes after it (its transients included)
    slack: int  # ``Binding.limit`` minus ``device`` (>= 0 when the plan fits)


@dataclass
class Binding:
    """The binding instructions of a plan and, per base activation, its cost and what it
    frees at them (module doc)."""

    limit: int  # the budget, or the peak when no instruction binds it
    epsilon: float
    binds: bool  # some instruction is within epsilon of the budget
    instructions: list[BindingInstruction]
    frees: dict[int, dict[int, int]] = field(default_factory=dict)  # tid -> {index: bytes}
    cost_s: dict[int, float] = field(default_factory=dict)  # tid -> seconds (see module doc)
    copy_s: dict[int, float] = field(default_factory=dict)  # offloaded tid -> copy seconds


def binding(graph: Graph, schedule: Schedule, budget: int | None, simulation: Any = None,
            epsilon: float = EPSILON) -> Binding:
    """The ``Binding`` of ``schedule`` on ``graph`` for ``budget`` (module doc); costs are
    left empty when ``simulation`` (a ``SimResult`` of this schedule) is None."""
    steps = list(residency_steps(graph, schedule))
    device = [s.device for s in steps[1:]]
    peak = max(device, default=0)
    binds = budget is not None and peak >= budget - int(epsilon * budget)
    limit = budget if binds and budget is not None else peak
    near = limit - int(epsilon * limit)
    bind_at = [i for i, mem in enumerate(device) if mem >= near]
    result = Binding(limit, epsilon, binds, [BindingInstruction(
        i, describe(graph, schedule.instructions[i]), device[i], limit - device[i])
        for i in bind_at])
    _frees(graph, schedule, steps, set(bind_at), result)
    if simulation is not None:
        _costs(graph, schedule, simulation, result)
    return result


def describe(graph: Graph, ins: object) -> str:
    """One instruction in words: its kind and the op or tensor it names."""
    from outcore.report.explain import module_path

    if isinstance(ins, Compute):
        op = graph.ops[ins.op]
        where = module_path(graph, op.id) or op.name
        return f"{'Recompute' if ins.recompute else 'Compute'} {where} ({op.name})"
    if isinstance(ins, Wait):
        return f"Wait({ins.direction}) {graph.tensors[ins.tensor].name}"
    tensor = getattr(ins, "tensor", None)
    name = graph.tensors[tensor].name if isinstance(tensor, int) else "?"
    return f"{type(ins).__name__} {name}"


def _positions(graph: Graph, schedule: Schedule) -> list[int]:
    """Per instruction: the position (graph op order) of the op it serves (module doc)."""
    order = {op.id: k for k, op in enumerate(graph.ops)}
    ins = schedule.instructions
    out = [len(graph.ops) - 1] * len(ins)
    nxt = len(graph.ops) - 1
    for i in range(len(ins) - 1, -1, -1):
        op = ins[i]
        if isinstance(op, Compute) and not op.recompute:
            nxt = order[op.op]
        out[i] = nxt
    return out


def _kept_spans(graph: Graph) -> dict[int, tuple[int, int]]:
    """Base activation -> (producer position, last reader position) under free-at-last-use:
    its storage's interval (``outcore.graph.liveness.storage_intervals``) in graph order."""
    intervals = storage_intervals(graph, [op.id for op in graph.ops])
    return {t.id: (intervals[t.storage].first, intervals[t.storage].last)
            for t in graph.activations()}


def _frees(graph: Graph, schedule: Schedule, steps: list[Any], bind_at: set[int],
           result: Binding) -> None:
    """Fill ``result.frees`` from the replay's residency at the binding instructions."""
    spans = _kept_spans(graph)
    position = _positions(graph, schedule)
    on_device: set[int] = set()
    for step in steps:
        for alloc in step.allocations:
            if alloc.storage >= 0:
                on_device.add(alloc.storage)
        if step.released != NONE:
            on_device.discard(step.released)
        if step.at not in bind_at:
            continue
        p = position[step.at]
        for tid, (start, end) in spans.items():
            if start <= p <= end and tid not in on_device and graph.tensors[tid].nbytes:
                result.frees.setdefault(tid, {})[step.at] = graph.tensors[tid].nbytes


def _costs(graph: Graph, schedule: Schedule, sim: Any, result: Binding) -> None:
    """Fill ``result.cost_s`` and ``copy_s`` from the simulated timeline (module doc)."""
    recomputed: dict[int, float] = {}
    for i, ins in enumerate(schedule.instructions):
        busy = float(sim.end[i] - sim.start[i])
        if isinstance(ins, Compute) and ins.recompute:
            recomputed[ins.op] = recomputed.get(ins.op, 0.0) + busy
        elif isinstance(ins, Wait):
            result.cost_s[ins.tensor] = result.cost_s.get(ins.tensor, 0.0) + busy
        elif isinstance(ins, (Offload, Prefetch)):
            result.copy_s[ins.tensor] = result.copy_s.get(ins.tensor, 0.0) + busy
    for t in graph.activations():
        producer = graph.producer_op(t.id).id
        if producer in recomputed:
            result.cost_s[t.id] = result.cost_s.get(t.id, 0.0) + recomputed[producer]
