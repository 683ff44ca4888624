"""Choose an operator variant per op for a Schedule under a budget (plain Python).

The schedule fixes which tensors are resident at every Compute; a variant only adds its
transient workspace there. Each op with a choice becomes one ``variants.select.Step``: its
live bytes are the most the device holds at any of its Computes (a recomputed op runs twice
and must fit both times), its candidates are the op's recorded variants timed by the cost
model. The strategies are the papers' (``outcore.variants.select``) plus the two extremes:

* ``memory-optimal``: the framework kernel everywhere (zero workspace);
* ``performance-optimal``: the fastest variant everywhere, whether it fits or not;
* ``superneurons``: the fastest variant that fits the free memory at that step;
* ``vdnn-greedy``: vDNN-dyn's greedy downgrade from the fastest.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from outcore.graph.ir import Graph
from outcore.plan.memory import memory_curve
from outcore.plan.schedule import Compute, Schedule
from outcore.variants.names import is_framework
from outcore.variants.select import (
    Candidate,
    Step,
    memory_optimal,
    performance_optimal,
    superneurons_fastest_fit,
    vdnn_dyn_greedy,
)

STRATEGIES = ("memory-optimal", "performance-optimal", "superneurons", "vdnn-greedy")


def variant_steps(graph: Graph, schedule: Schedule, cost: Any) -> list[Step]:
    """One Step per op that has usable variants, with its worst-case live bytes."""
    trace = memory_curve(graph, Schedule(schedule.instructions, schedule.keep_at_end),
                         workspace=lambda _op: 0)
    live: dict[int, int] = {}
    for i, ins in enumerate(schedule.instructions):
        if isinstance(ins, Compute) and graph.ops[ins.op].variant_options:
            live[ins.op] = max(live.get(ins.op, 0), trace.device[i])
    steps = []
    for oid, live_bytes in live.items():
        op = graph.ops[oid]
        candidates = tuple(
            Candidate(name, float(cost.op_time(dataclasses.replace(
                op, variant="" if is_framework(name) else name))), int(option["workspace"]))
            for name, option in op.variant_options.items() if "refused" not in option)
        steps.append(Step(str(oid), live_bytes, candidates))
    return steps


def choose_variants(graph: Graph, schedule: Schedule, cost: Any, budget: int | None,
                    strategy: str = "superneurons") -> dict[int, str]:
    """Op id -> variant under ``strategy`` (framework choices are left out of the map)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown variant strategy {strategy!r}; choose one of {STRATEGIES}")
    steps = variant_steps(graph, schedule, cost)
    limit = budget if budget is not None else max((s.live_bytes for s in steps), default=0) + 2**62
    if strategy == "memory-optimal":
        chosen = {s.op: memory_optimal(s.candidates).variant for s in steps}
    elif strategy == "performance-optimal":
        chosen = {s.op: performance_optimal(s.candidates).variant for s in steps}
    elif strategy == "superneurons":
        chosen = superneurons_fastest_fit(steps, limit)
    else:
        chosen = vdnn_dyn_greedy(steps, limit)
    return {int(op): v for op, v in chosen.items() if not is_framework(v)}


def with_variants(schedule: Schedule, variants: dict[int, str]) -> Schedule:
    """A copy of ``schedule`` that runs ``variants``."""
    return dataclasses.replace(schedule, variants=dict(variants))
