"""Release points for a lowered plan's offloads: wait for a copy-out where it has ended.

``outcore.plan.lower`` places an offloaded activation's ``Wait(d2h)`` and ``Free`` right
after its last forward use unless the plan names a later forward op in ``release_at``. When
that use follows its producer closely, the copy-out is still running there and the compute
stream stalls on the Wait. The greedy planner names no release points, so on SuperNeurons'
2,500-unit ResNet at half its in-core peak its offload-everything plan stalled 1,290 times
(0.084 ms each: 0.109 s, 3.1% of the step) although the D2H engine was busy for only 0.24 s
of a 1.17 s forward.

``delay_releases`` moves each stalled Wait (and its Free) to before the first later forward
op that starts after the copy-out ends, on the timeline the simulation gives with the
stalls before each point taken out (every stall removed shifts what follows earlier by as
much; a copy whose engine is idle moves with its producer). Holding a tensor longer raises
the memory between its last use and its new release point, so moves whose held interval
covers an instruction above the budget are dropped again (only dropping, so at most
``BACKOFF_ROUNDS`` lowerings, and none more once no move holds memory where the excess
is). The plan with its release points is kept only when it verifies, fits the budget and
simulates strictly faster; otherwise the plan is returned unchanged. Decisions and
prefetch points are never changed, so what the step computes does not either.
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import NamedTuple

from outcore.graph.ir import Graph, Phase
from outcore.plan.lower import lower
from outcore.plan.memory import MemoryTrace, memory_curve
from outcore.plan.plan import Decision, Plan
from outcore.plan.schedule import Compute, Free, Offload, Schedule, Wait
from outcore.plan.verify import verify
from outcore.sim import simulate
from outcore.sim.result import SimResult

#: Lowerings at most while moves are dropped for memory (each drops at least one move).
BACKOFF_ROUNDS = 6
#: A Wait that stalls less than this (seconds) is left where it is.
MIN_STALL = 1e-9


def delay_releases(graph: Graph, plan: Plan, schedule: Schedule, budget: int,
                   cost: object) -> tuple[Plan, Schedule]:
    """``plan`` with release points for its stalled copy-outs, and its schedule, when that
    fits ``budget`` and simulates faster on ``cost``; else ``(plan, schedule)`` unchanged
    (module doc). ``plan`` is never mutated."""
    out = released(graph, plan, schedule, budget, cost)
    return out.plan, out.schedule


class Released(NamedTuple):
    """``released``'s answer: the plan, its schedule, and that schedule's simulation on the
    cost model it was given (``outcore.sim.simulate``'s result, so a caller need not replay
    the schedule again); ``trace``: its memory curve (``outcore.plan.memory.memory_curve``)
    where it was computed (the schedule with release points), else None."""

    plan: Plan
    schedule: Schedule
    simulation: SimResult
    trace: MemoryTrace | None = None


def released(graph: Graph, plan: Plan, schedule: Schedule, budget: int,
             cost: object) -> Released:
    """``delay_releases`` with the simulation of the schedule it returns."""
    sim = simulate(graph, schedule, cost)  # type: ignore[arg-type]
    moves = _moves(graph, plan, schedule, sim)
    if not moves:
        return Released(plan, schedule, sim)
    held_after = _last_forward_use(schedule, moves)
    for _ in range(BACKOFF_ROUNDS):
        trial = dataclasses.replace(plan, release_at={**plan.release_at, **moves})
        lowered = lower(graph, trial)
        trace = memory_curve(graph, lowered)
        if trace.peak <= budget:
            verify(graph, lowered)
            faster = simulate(graph, lowered, cost)  # type: ignore[arg-type]
            if faster.step_time < sim.step_time:
                return Released(_noted(trial, moves), lowered, faster, trace)
            return Released(plan, schedule, sim)
        over = [i for i, mem in enumerate(trace.device) if mem > budget]
        spans = _held_spans(lowered, held_after, moves)
        kept = {t: op for t, op in moves.items()
                if not _covers(over, *spans.get(t, (0, len(trace.device))))}
        if not kept or len(kept) == len(moves):
            break  # nothing left, or the excess is none of the moves' doing
        moves = kept
    return Released(plan, schedule, sim)


def _moves(graph: Graph, plan: Plan, schedule: Schedule, sim: SimResult) -> dict[int, int]:
    """Offloaded tensor -> the forward op to release it before, for every stalled
    forward Wait(d2h) of ``schedule`` that a later forward op can absorb."""
    ins = schedule.instructions
    stall_before = [0.0] * (len(ins) + 1)  # seconds stalled by instructions before i
    for i, op in enumerate(ins):
        stalled = sim.end[i] - sim.start[i] if isinstance(op, Wait) else 0.0
        stall_before[i + 1] = stall_before[i] + max(0.0, stalled)
    forward: list[tuple[float, int]] = []  # (stall-free start, op id) of forward Computes
    copied_at: dict[int, int] = {}  # tensor -> its Offload's index
    for i, op in enumerate(ins):
        if isinstance(op, Compute) and not op.recompute:
            if graph.ops[op.op].phase is not Phase.FORWARD:
                break
            forward.append((sim.start[i] - stall_before[i], op.op))
        elif isinstance(op, Offload):
            copied_at[op.tensor] = i
    starts = [s for s, _ in forward]
    moves: dict[int, int] = {}
    for i, op in enumerate(ins[:len(ins) - 1]):
        if not (isinstance(op, Wait) and op.direction == "d2h" and isinstance(ins[i + 1], Free)):
            continue
        t = op.tensor
        if (sim.end[i] - sim.start[i] <= MIN_STALL or t in plan.release_at
                or plan.decisions.get(t) is not Decision.OFFLOAD or t not in copied_at):
            continue
        ends = sim.end[i] - stall_before[copied_at[t]]  # the copy moves with its producer
        j = bisect.bisect_left(starts, ends)
        if j < len(forward) and forward[j][0] > sim.start[i] - stall_before[i]:
            moves[t] = forward[j][1]
    return moves


def _last_forward_use(schedule: Schedule, moves: dict[int, int]) -> dict[int, int]:
    """Moved tensor -> the op of the Compute right before its Wait(d2h) in ``schedule``
    (its last forward use: lowering waits and frees right after it)."""
    ins = schedule.instructions
    out: dict[int, int] = {}
    last = -1
    for op in ins:
        if isinstance(op, Compute):
            last = op.op
        elif isinstance(op, Wait) and op.direction == "d2h" and op.tensor in moves:
            out[op.tensor] = last
    return out


def _held_spans(schedule: Schedule, held_after: dict[int, int],
                moves: dict[int, int]) -> dict[int, tuple[int, int]]:
    """Moved tensor -> (index of its last forward use's Compute, index of its Wait(d2h)) in
    ``schedule``: the instructions the move holds it over."""
    at: dict[int, int] = {}
    release: dict[int, int] = {}
    for i, op in enumerate(schedule.instructions):
        if isinstance(op, Compute) and not op.recompute:
            at.setdefault(op.op, i)
        elif isinstance(op, Wait) and op.direction == "d2h" and op.tensor in moves:
            release[op.tensor] = i
    return {t: (at.get(held_after.get(t, -1), 0), r) for t, r in release.items()}


def _covers(over: list[int], lo: int, hi: int) -> bool:
    """Whether a sorted index list ``over`` has an index in ``[lo, hi)``."""
    k = bisect.bisect_left(over, lo)
    return k < len(over) and over[k] < hi


def _noted(plan: Plan, moves: dict[int, int]) -> Plan:
    reasons = dict(plan.reasons)
    for t in moves:
        reasons[t] = (reasons.get(t, "offloaded") + "; its copy-out is waited for later in "
                      "the forward (release point), where it has ended")
    return dataclasses.replace(plan, reasons=reasons)
