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
  and the recompute chain that made it resident again in backward: the chain rebuilds its
  ancestors first, so it starts at or after ``a_s``, the instruction just after the last
  regular (not recompute) Compute before ``s`` is allocated again. Let ``j0 = min a_s``
  over the chunk. Before ``j0`` the trial's schedule runs the same Computes as the current
  one (forward is the same; backward ops before ``j0`` ensure the same inputs, none of the
  chunk's, else ``a_s`` would be earlier), so each instruction ``i < j0`` holds what it held
  plus every chunk storage with ``r_s <= i``, less what a Free moved earlier releases.
* A Free moves earlier (into ``i < j0``) only when its tensor's uses at or after ``j0``
  are all recomputes the trial no longer runs, so its release follows a recompute; the
  same holds for a saved RNG state held until a recompute. Before ``j0`` Frees never move
  later and nothing is allocated earlier, so subtracting, from its allocation on, every
  storage live across ``j0`` whose release follows a recompute (and every RNG state that
  may end) gives a lower bound on the trial's device bytes before ``j0``.

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
from typing import NamedTuple

import numpy as np

from outcore.cost.model import CostModel
from outcore.graph.ir import Graph, Phase
from outcore.plan.lower import lower
from outcore.plan.plan import Decision, Plan
from outcore.plan.residency import NONE, residency_steps, rng_state_bytes
from outcore.plan.schedule import Compute, Free, Schedule
from outcore.policies.baseline import movable_activations

#: Activations tried at once when keeping back (a chunk that does not fit is halved).
KEEP_CHUNK = 8

Lowerer = Callable[[Graph, Plan], Schedule]


class Span(NamedTuple):
    """Bytes held from ``start`` through ``end`` that a trial may release earlier: a
    residency released after the recompute at ``end``'s left (skipping Frees) or a saved
    RNG state held until the recompute at ``end``. That recompute stays in a trial (so the
    span ends no earlier than ``j0``) when the chunk leaves out some of ``witnesses`` and
    all of ``chain`` (``_Chains``)."""

    start: int
    end: int
    nbytes: int
    witnesses: frozenset[int]
    chain: frozenset[int]

    def may_end(self, chunk: set[int]) -> bool:
        """Whether a trial keeping ``chunk`` may drop the recompute this span ends at."""
        return self.witnesses <= chunk or not self.chain.isdisjoint(chunk)


@dataclass(frozen=True)
class Screen:
    """What the rejection test needs from one exact replay of the current schedule.

    ``device[i]``: device bytes after instruction ``i``. ``first_release[s]`` and
    ``back_at[s]``: for a storage released and made resident again, the index of its first
    release and where the recompute chain that allocates it again may start (``r_s`` and
    ``a_s`` of the module doc). ``spans``: what a trial may release earlier; those without
    witnesses end earlier whatever the chunk (``starts``, ``ends``, ``nbytes``: theirs, as
    arrays); ``witnessed[s]``: the others with storage ``s`` among their witnesses or
    chain.
    """

    device: np.ndarray
    first_release: dict[int, int]
    back_at: dict[int, int]
    storage_bytes: Sequence[int]
    spans: tuple[Span, ...]
    starts: np.ndarray
    ends: np.ndarray
    nbytes: np.ndarray
    witnessed: dict[int, list[int]]

    def bound(self, storages: Iterable[int]) -> int | None:
        """A lower bound on the peak of the current plan with every storage of ``storages``
        (recomputed activations that backward reads, as ``keep_back`` tries) kept as well:
        the most device bytes any instruction before ``j0`` holds (module doc). None when
        the replay does not say (a storage not released and made resident again)."""
        chunk = set(storages)
        j0 = self.first_change(chunk)
        if j0 is None:
            return None
        delta = np.zeros(j0, dtype=np.int64)
        for s in chunk:
            if self.first_release[s] < j0:
                delta[self.first_release[s]] += self.storage_bytes[s]
        moved = (self.ends >= j0) & (self.starts < j0)
        np.add.at(delta, self.starts[moved], -self.nbytes[moved])
        for k in sorted({k for s in chunk for k in self.witnessed.get(s, ())}):
            span = self.spans[k]
            if span.start < j0 <= span.end and span.may_end(chunk):
                delta[span.start] -= span.nbytes
        return int((self.device[:j0] + np.cumsum(delta)).max())

    def first_change(self, storages: Iterable[int]) -> int | None:
        """``j0``: the trial keeping ``storages`` runs the same Computes as the current
        schedule before this index (module doc); None when the replay does not say."""
        chunk = list(storages)
        if not chunk or any(s not in self.back_at for s in chunk):
            return None
        j0 = min(self.back_at[s] for s in chunk)
        return j0 if j0 > 0 else None

    def rejects(self, storages: Iterable[int], budget: int) -> bool:
        """Whether keeping every storage of ``storages`` surely exceeds ``budget``; False
        means "unknown": lower the trial."""
        bound = self.bound(storages)
        return bound is not None and bound > budget


def peak_and_screen(graph: Graph, schedule: Schedule, screen: bool = True
                    ) -> tuple[int, Screen | None]:
    """The peak of ``schedule`` (``memory_curve(...).peak``, the same replay) and, when
    ``screen`` and it holds Computes and Frees only, its ``Screen``."""
    instructions = schedule.instructions
    screenable = screen and all(isinstance(ins, (Compute, Free)) for ins in instructions)
    steps = residency_steps(graph, schedule)
    static = next(steps)
    if not screenable:
        return max((step.device for step in steps), default=static.device), None
    opened = {a.storage: -1 for a in static.allocations if a.storage >= 0}
    runs: dict[int, list[tuple[int, int]]] = {}
    chains = _Chains(graph)
    device: list[int] = []
    for step in steps:
        device.append(step.device)
        for alloc in step.allocations:
            if alloc.storage >= 0:
                opened[alloc.storage] = step.at
        if step.released != NONE:
            runs.setdefault(step.released, []).append((opened.pop(step.released), step.at))
        chains.step(instructions[step.at], step.at, step.made_resident, step.dropped)
    return max(device, default=static.device), _screen(graph, instructions, device, runs,
                                                       chains.witnesses())


class _Chains:
    """Which recomputes a trial keeps running, from the replay: a recompute stays when a
    storage it makes resident (not kept by the chunk) is read by a backward op, or by a
    recompute that stays. ``witnesses()`` gives, per recompute index, ``(W, M)``: the
    storages read back at the end of its chains and every storage its chains make
    resident; it stays in any trial whose chunk leaves some of ``W`` out and none of ``M``
    in (every recompute on such a chain needs the one before it)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        backward = {t.storage for t in graph.tensors
                    if any(graph.ops[c].phase is Phase.BACKWARD for c in t.consumers)}
        self.read_back = backward
        self.made_at: dict[int, int] = {}  # resident tensor -> the recompute that made it
        self.fresh: dict[int, frozenset[int]] = {}  # recompute -> storages it made resident
        self.feeds: dict[int, set[int]] = {}  # recompute -> recomputes reading what it made

    def step(self, ins: object, at: int, made: tuple[int, ...], dropped: int) -> None:
        if dropped != NONE:
            self.made_at.pop(dropped, None)
        if not isinstance(ins, Compute):
            return
        if not ins.recompute:
            for tid in made:
                self.made_at.pop(tid, None)
            return
        for tid in self.graph.ops[ins.op].inputs:
            k = self.made_at.get(tid)
            if k is not None:
                self.feeds.setdefault(k, set()).add(at)
        for tid in made:
            self.made_at[tid] = at
        self.fresh[at] = frozenset(self.graph.tensors[t].storage for t in made)

    def witnesses(self) -> dict[int, tuple[frozenset[int], frozenset[int]]]:
        out: dict[int, tuple[frozenset[int], frozenset[int]]] = {}
        for k in sorted(self.fresh, reverse=True):  # readers come after what they read
            w = set(self.fresh[k] & self.read_back)
            m = set(self.fresh[k])
            for reader in self.feeds.get(k, ()):
                w |= out[reader][0]
                m |= out[reader][1]
            out[k] = (frozenset(w), frozenset(m))
        return out


def _screen(graph: Graph, instructions: Sequence[object], device: list[int],
            runs: dict[int, list[tuple[int, int]]],
            witnesses: dict[int, tuple[frozenset[int], frozenset[int]]]) -> Screen:
    last_compute: list[int] = []  # per index: the last Compute at or before it (-1: none)
    chain_start: list[int] = []  # per index: just after the last regular Compute before it
    last, start = -1, 0
    for i, ins in enumerate(instructions):
        chain_start.append(start)
        if isinstance(ins, Compute):
            last = i
            if not ins.recompute:
                start = i + 1
        last_compute.append(last)
    storage_bytes = [t.nbytes for t in graph.tensors]
    first_release: dict[int, int] = {}
    back_at: dict[int, int] = {}
    spans: list[Span] = []
    for s, held in runs.items():
        first_release[s] = held[0][1]
        if len(held) >= 2:
            back_at[s] = chain_start[held[1][0]]
        for begin, end in held:
            k = last_compute[end]
            if k in witnesses and storage_bytes[s]:
                spans.append(Span(max(begin, 0), end, storage_bytes[s], *witnesses[k]))
    spans += [Span(begin, end, rng_state_bytes(graph), *witnesses[end])
              for begin, end in _rng_states(graph, instructions)]
    free = [span for span in spans if not span.witnesses]
    witnessed: dict[int, list[int]] = {}
    for k, span in enumerate(spans):
        if span.witnesses:
            for s in span.witnesses | span.chain:
                witnessed.setdefault(s, []).append(k)
    return Screen(np.asarray(device, dtype=np.int64), first_release, back_at, storage_bytes,
                  tuple(spans), np.asarray([x.start for x in free], dtype=np.int64),
                  np.asarray([x.end for x in free], dtype=np.int64),
                  np.asarray([x.nbytes for x in free], dtype=np.int64), witnessed)


def _rng_states(graph: Graph, instructions: Sequence[object]) -> list[tuple[int, int]]:
    """(first Compute, recompute) of every random op the schedule recomputes: the saved RNG
    state it holds (``outcore.plan.residency``) ends there, and a trial that no longer
    recomputes it never saves it. (An op is recomputed at most once: its outputs stay
    resident from that recompute until their last use.)"""
    if not rng_state_bytes(graph):
        return []
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, ins in enumerate(instructions):
        if isinstance(ins, Compute) and graph.ops[ins.op].random:
            first.setdefault(ins.op, i)
            if ins.recompute:
                last[ins.op] = i
    return [(first[op], end) for op, end in last.items()]


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
    current = peak_and_screen(graph, schedule)[1] if screen and pending else None
    while pending:  # group testing: a chunk that fits is kept whole, else split in halves
        chunk = pending.pop(0)
        if current is None or not current.rejects(chunk, budget):
            for tid in chunk:
                del plan.decisions[tid]
            trial = lowerer(graph, plan)
            peak, current_after = peak_and_screen(graph, trial, screen)
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
