"""outcore-checkpoint's keep-back: keep recomputed activations again while the budget holds.

``keep_back`` takes a recompute plan that fits and keeps again, most recompute seconds per
byte first, every recomputed activation backward reads whenever the peak (the memory rule
of ``outcore.plan.memory``) stays within the budget. It tests chunks of ``KEEP_CHUNK``
activations at once; a chunk that does not fit is split in halves (group testing), a
single activation that does not fit stays recomputed.

Every accepted chunk is lowered and replayed exactly, so the plan returned, and each plan
a later trial starts from, has the exact predicted peak. What is cheap is the *rejection*
of a chunk, which is most trials once the budget is nearly used (on ResNet-152 b256 in
16 GiB, 431 of 477). A ``Screen`` reads it off the current schedule's replay without
lowering the trial:

* Keeping a recomputed storage ``s`` removes its forward release (at instruction ``r_s``)
  and the recompute that made it resident again in backward (at ``a_s``). Let
  ``j0 = min a_s`` over the chunk. Before ``j0`` the trial's schedule runs the same
  instructions as the current one (forward is the same; backward ops before ``j0`` ensure
  the same inputs, none of the chunk's, else ``a_s`` would be earlier), so each instruction
  ``i < j0`` holds what it held plus every chunk storage with ``r_s <= i``.
* The only other change before ``j0`` is a Free moved earlier: a tensor whose last use
  was a recompute at or after ``j0`` that the trial no longer runs. Frees never move later
  and nothing is allocated earlier, so subtracting, from its allocation on, every storage
  live across ``j0`` whose release follows a recompute gives a lower bound on the trial's
  device bytes before ``j0``.

When that bound exceeds the budget at some ``i < j0``, the trial's peak does too and the
chunk is rejected as the exact test would; otherwise the trial is lowered and replayed.
So the plan is the same as lowering every trial (``screen=False``, the reference the
tests compare against). The screen applies to schedules of Computes and Frees only
(a checkpoint plan's own); with copies in it (parameters held in host memory), every trial
is lowered.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from outcore.cost.model import CostModel
from outcore.graph.ir import Graph
from outcore.plan.lower import lower
from outcore.plan.plan import Decision, Plan
from outcore.plan.residency import NONE, Step, residency_steps
from outcore.plan.schedule import Compute, Free, Schedule
from outcore.policies.baseline import movable_activations

#: Activations tried at once when keeping back (a chunk that does not fit is halved).
KEEP_CHUNK = 8

Lowerer = Callable[[Graph, Plan], Schedule]


@dataclass(frozen=True)
class Screen:
    """What the rejection test needs from one exact replay of the current schedule.

    ``device[i]``: device bytes after instruction ``i``. ``first_release[s]`` and
    ``back_at[s]``: for a storage released and made resident again, the index of its first
    release and of the allocation after it (``r_s`` and ``a_s`` of the module doc).
    ``starts``, ``ends``, ``nbytes``: the residencies whose release follows a recompute
    (skipping Frees), i.e. those a trial may end earlier.
    """

    device: np.ndarray
    first_release: dict[int, int]
    back_at: dict[int, int]
    storage_bytes: Sequence[int]
    starts: np.ndarray
    ends: np.ndarray
    nbytes: np.ndarray

    def rejects(self, storages: Iterable[int], budget: int) -> bool:
        """Whether keeping every storage of ``storages`` surely exceeds ``budget`` (a lower
        bound on the trial's device bytes before ``j0`` does; module doc). False means
        "unknown": lower the trial."""
        chunk = list(storages)
        if any(s not in self.back_at for s in chunk):
            return False
        j0 = min(self.back_at[s] for s in chunk)
        if j0 <= 0:
            return False
        delta = np.zeros(j0, dtype=np.int64)
        for s in chunk:
            if self.first_release[s] < j0:
                delta[self.first_release[s]] += self.storage_bytes[s]
        moved = (self.ends >= j0) & (self.starts < j0)
        np.add.at(delta, self.starts[moved], -self.nbytes[moved])
        return bool((self.device[:j0] + np.cumsum(delta)).max() > budget)


def replay(graph: Graph, schedule: Schedule, screen: bool = True
           ) -> tuple[int, Screen | None]:
    """The peak of ``schedule`` (``memory_curve(...).peak``, the same replay) and, when
    ``screen`` and it holds Computes and Frees only, its ``Screen``."""
    instructions = schedule.instructions
    screenable = screen and all(isinstance(ins, (Compute, Free)) for ins in instructions)
    steps = residency_steps(graph, schedule)
    static = next(steps)
    opened = {a.storage: -1 for a in static.allocations if a.storage >= 0}
    device: list[int] = []
    spans: dict[int, list[tuple[int, int]]] = {}
    for step in steps:
        device.append(step.device)
        if screenable:
            _track(step, opened, spans)
    peak = max(device, default=static.device)
    if not screenable:
        return peak, None
    return peak, _screen(graph, instructions, device, spans)


def _track(step: Step, opened: dict[int, int], spans: dict[int, list[tuple[int, int]]]) -> None:
    for alloc in step.allocations:
        if alloc.storage >= 0:
            opened[alloc.storage] = step.at
    if step.released != NONE:
        spans.setdefault(step.released, []).append((opened.pop(step.released), step.at))


def _screen(graph: Graph, instructions: Sequence[object], device: list[int],
            spans: dict[int, list[tuple[int, int]]]) -> Screen:
    after_recompute: list[bool] = []  # per index: the last non-Free at or before is a recompute
    last = False
    for ins in instructions:
        if isinstance(ins, Compute):
            last = ins.recompute
        after_recompute.append(last)
    storage_bytes = [t.nbytes for t in graph.tensors]
    first_release: dict[int, int] = {}
    back_at: dict[int, int] = {}
    starts: list[int] = []
    ends: list[int] = []
    nbytes: list[int] = []
    for s, runs in spans.items():
        first_release[s] = runs[0][1]
        if len(runs) >= 2:
            back_at[s] = runs[1][0]
        for start, end in runs:
            if after_recompute[end] and storage_bytes[s]:
                starts.append(max(start, 0))
                ends.append(end)
                nbytes.append(storage_bytes[s])
    return Screen(np.asarray(device, dtype=np.int64), first_release, back_at, storage_bytes,
                  np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64),
                  np.asarray(nbytes, dtype=np.int64))


def op_seconds(graph: Graph, cost: CostModel | None) -> list[float]:
    """Each op's seconds under ``cost`` (a flop-count stand-in without one)."""
    if cost is None:
        return [float(op.flops) * 1e-12 + 1e-6 for op in graph.ops]
    return [float(cost.op_time(op)) for op in graph.ops]


def keep_back(graph: Graph, plan: Plan, schedule: Schedule, budget: int,
              cost: CostModel | None, lowerer: Lowerer = lower, *, screen: bool = True
              ) -> tuple[Plan, Schedule]:
    """Keep again, most recompute seconds per byte first, every recomputed activation that
    backward reads while the peak stays within ``budget`` (module doc). ``plan`` (changed
    in place and returned) must fit with ``schedule``, its lowering; ``screen=False``
    lowers every trial (the reference)."""
    seconds = op_seconds(graph, cost)
    saved = [t for t in movable_activations(graph)
             if plan.decisions.get(t) is Decision.RECOMPUTE]

    def value(tid: int) -> float:
        producer = graph.producer_op(tid)
        return seconds[producer.id] / max(graph.tensors[tid].nbytes, 1)

    order = [t for t in sorted(saved, key=value, reverse=True)
             if seconds[graph.producer_op(t).id] > 0]
    pending = [order[i:i + KEEP_CHUNK] for i in range(0, len(order), KEEP_CHUNK)]
    current = replay(graph, schedule)[1] if screen and pending else None
    while pending:  # group testing: a chunk that fits is kept whole, else split in halves
        chunk = pending.pop(0)
        trial = None
        if current is None or not current.rejects(chunk, budget):
            for tid in chunk:
                del plan.decisions[tid]
            trial = lowerer(graph, plan)
            peak, current_after = replay(graph, trial, screen)
            if peak <= budget:
                schedule, current = trial, current_after
                for tid in chunk:
                    plan.reasons[tid] = ("kept: recomputing it would cost "
                                         f"{seconds[graph.producer_op(tid).id] * 1e3:.3f} ms "
                                         "and the budget holds it")
                continue
            for tid in chunk:
                plan.decisions[tid] = Decision.RECOMPUTE
        if len(chunk) > 1:
            half = len(chunk) // 2
            pending[:0] = [chunk[:half], chunk[half:]]
    return plan, schedule
