"""Operator-variant candidates and per-step memory, shared by the vDNN and SuperNeurons policies.

Both papers choose a convolution algorithm per layer under the memory left at that layer
(vDNN's memory-optimal / performance-optimal settings and its greedy downgrade; SuperNeurons'
fastest algorithm that fits in the free bytes). This module turns a Graph, a cost model and a
table of supported variants into those choices' inputs (plain Python, no torch).

Where candidates come from. The ``variants`` option (of a policy config) maps an op id to the
names of the
variants that can run it (for example ``CudnnAlgorithms.supported()`` from
``outcore.policies.vdnn.cudnn``, or a table built with ``outcore.variants.registry``).
Each candidate is priced by the context's cost model on a copy of the op with ``variant`` set:
``time_s = cost.op_time(op)``, ``workspace_bytes = cost.workspace(op)``. "framework" (the
framework's own kernel, zero workspace: the memory-optimal algorithm) is always a candidate.
Without a table, or without a cost model, every op runs the framework kernel and the
memory-optimal and performance-optimal settings coincide.

Per-step memory. ``steps`` turns a Schedule into ``outcore.variants.select.Step`` rows: one per
instruction, whose ``live_bytes`` is ``outcore.plan.memory``'s sample for that instruction
without any workspace (workspace is transient, so choosing a variant never changes another
step's live bytes). A Compute of an op with candidates carries them; every other row only has
to fit. An op computed more than once is one row at its largest live bytes (a Schedule holds
one variant per op).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from outcore.errors import PolicyOptionError
from outcore.graph.ir import Graph
from outcore.plan.memory import memory_curve, predicted_peak
from outcore.plan.schedule import Compute, Schedule
from outcore.policies.common.costs import bound
from outcore.policies.common.variant_spec import recorded
from outcore.variants.registry import FRAMEWORK  # the one spelling of the framework's kernel
from outcore.variants.select import Candidate, Step, memory_optimal, performance_optimal


@dataclass(frozen=True)
class Variants:
    """The candidates of every op that has a choice (op id -> candidates, framework first)."""

    by_op: Mapping[int, tuple[Candidate, ...]] = field(default_factory=dict)

    def memory_optimal(self) -> dict[int, str]:
        """Every op on its least-workspace candidate (vDNN's "(m)" setting)."""
        return {op: memory_optimal(c).variant for op, c in self.by_op.items()}

    def performance_optimal(self) -> dict[int, str]:
        """Every op on its fastest candidate (vDNN's "(p)" setting)."""
        return {op: performance_optimal(c).variant for op, c in self.by_op.items()}

    def workspace_of(self, choice: Mapping[int, str]) -> Callable[[int], int]:
        """``op id -> workspace bytes`` of the chosen variants (0 for ops without a choice)."""
        table = {op: {c.variant: c.workspace_bytes for c in cands}
                 for op, cands in self.by_op.items()}

        def workspace(op: int) -> int:
            chosen = choice.get(op)
            return table[op][chosen] if chosen is not None and op in table else 0

        return workspace

    def time_of(self, op: int, variant: str) -> float:
        return next(c.time_s for c in self.by_op[op] if c.variant == variant)


def candidates(graph: Graph, cost: Any, table: Mapping[int, Sequence[str]] | None) -> Variants:
    """Price every listed variant of every listed op with ``cost`` (see the module docstring).

    Raises PolicyOptionError naming the op when the table names an unknown op id.
    """
    if not table or cost is None:
        return Variants({})
    model = bound(graph, cost)
    by_op: dict[int, tuple[Candidate, ...]] = {}
    for op_id, names in table.items():
        if not 0 <= op_id < len(graph.ops):
            raise PolicyOptionError(f"the variants table names op {op_id}, but graph "
                                    f"{graph.name!r} has {len(graph.ops)} ops; build the table "
                                    "for this graph", f"op ids 0..{len(graph.ops) - 1}")
        ordered = [FRAMEWORK] + [n for n in names if n != FRAMEWORK]
        if len(ordered) < 2:
            continue
        op = graph.ops[op_id]
        rows = []
        for name in dict.fromkeys(ordered):
            priced = dataclasses.replace(op, variant=name)
            rows.append(Candidate(name, float(model.op_time(priced)), int(model.workspace(priced))))
        by_op[op_id] = tuple(rows)
    return Variants(by_op)


def recorded_table(graph: Graph) -> dict[int, list[str]]:
    """Op id -> the variants capture recorded as able to run it (``Op.variant_options``)."""
    return recorded(graph)


def steps(graph: Graph, schedule: Schedule, variants: Variants) -> list[Step]:
    """One ``Step`` per instruction (see the module docstring); keys are op ids as strings
    for Computes of ops with candidates, ``"@<index>"`` for the other rows."""
    samples = memory_curve(graph, schedule).device
    rows: list[Step] = []
    choice_rows: dict[int, int] = {}
    for i, ins in enumerate(schedule.instructions):
        live = samples[i]
        if isinstance(ins, Compute) and ins.op in variants.by_op:
            at = choice_rows.get(ins.op)
            if at is None:
                choice_rows[ins.op] = len(rows)
                rows.append(Step(str(ins.op), live, variants.by_op[ins.op]))
            elif live > rows[at].live_bytes:
                rows[at] = Step(str(ins.op), live, variants.by_op[ins.op])
            continue
        rows.append(Step(f"@{i}", live))
    return rows


def choice_by_op(choice: Mapping[str, str]) -> dict[int, str]:
    """Turn a ``select`` result keyed by ``steps`` keys back into ``{op id: variant}``."""
    return {int(key): variant for key, variant in choice.items() if not key.startswith("@")}


def peak_with(graph: Graph, schedule: Schedule, variants: Variants,
              choice: Mapping[int, str]) -> int:
    """Predicted peak of ``schedule`` with the workspace of ``choice``."""
    return predicted_peak(graph, schedule, variants.workspace_of(choice))


def with_variants(schedule: Schedule, choice: Mapping[int, str]) -> Schedule:
    """``schedule`` carrying ``choice`` as its per-op variants."""
    return dataclasses.replace(schedule, variants=dict(sorted(choice.items())))
