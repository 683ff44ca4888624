"""A fast timeline and memory simulation of a keep / swap / recompute classification.

PoocH (§4.1.2) "simulates an execution timeline and memory management processes" for each
classification it considers; Dymem's scheduler needs the same forward timeline to know when
an offloaded feature map can be released. Building a Schedule and running the full
simulator for each of the hundreds of classifications a search visits would cost tens of
milliseconds each, so this module models the same execution at op granularity (one array
of positions, the execution ``order``, forward first):

* ``Profile`` holds what a classification does not change (the "profiling iterations"):
  op times from the cost model, transfer times, the feature maps and their uses, each
  feature map's recompute chain, and ``base``: the device bytes after each op when every
  feature map is dropped after its last forward use.
* ``evaluate`` replays one classification:

  - forward: ops run back to back; a swapped map's copy-out starts when its producer ends
    (FIFO on the D2H engine); the map is released before the first op that starts after its
    copy ended and after its last forward use (forward never waits for a copy-out, PoocH
    §4.4.2), unless memory would overflow, then the compute stream waits for the earliest
    copies to end (Dymem §3.2.1); ``sync_forward`` (Dymem) waits for all copies at the end
    of forward; a copy still running in backward keeps its map until it ends, unless memory
    would overflow first, then the compute stream waits for it there;
  - backward: a recomputed map is re-made just before its first backward use (or before an
    earlier recompute that reads it); its chain of dropped forward intermediates is re-run
    with it. A swapped map's copy-in is issued at ``swap_in_at`` positions (the caller's
    rule; see ``earliest_fit``) on the H2D engine, not before its copy-out ended, and the
    compute stream waits for it before its first use.

It returns the step time, the peak, and per-map timings (copy-out end, copy-in stall) that
PoocH's LO / LI sets are read from. Position p's memory is the sample after op p's Compute
(outputs included); a copy-in issued "at p" is allocated before op p runs.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from outcore.errors import GraphError
from outcore.graph.ir import STATIC_KINDS, Graph, OpCategory, Phase, TensorKind
from outcore.graph.liveness import memory_per_step


class FeatureClass(StrEnum):
    """PoocH's three classes of a feature map (Dymem uses KEEP and SWAP)."""

    KEEP = "keep"
    SWAP = "swap"
    RECOMPUTE = "recompute"


KEEP, SWAP, RECOMPUTE = FeatureClass.KEEP, FeatureClass.SWAP, FeatureClass.RECOMPUTE


def producer(graph: Graph, tid: int) -> int:
    """The op that makes tensor ``tid`` (a graph input has none: GraphError)."""
    op = graph.tensors[tid].producer
    if op is None:
        raise GraphError(f"{graph.tensors[tid].name!r} is a graph input: no op makes it")
    return op
#: Feature maps are activations of at least this fraction of the largest one (the others,
#: batch-norm statistics and the like, are kept).
FEATURE_FRACTION = 1 / 1024


@dataclass(frozen=True)
class Chain:
    """What re-making a feature map costs: the ops re-run (in order), their time, the most
    bytes alive at once beside the map while they run (dropped intermediates and duplicate
    outputs), and the activations they read."""

    ops: tuple[int, ...]
    seconds: float
    transient: int
    reads: tuple[int, ...]


class Profile:
    """Classification-independent data of one graph, order and cost model."""

    def __init__(self, graph: Graph, order: list[int], cost: Any,
                 features: Sequence[int] | None = None) -> None:
        self.cost = cost.bind(graph)
        self.graph = graph
        fwd = [o for o in order if graph.ops[o].phase is Phase.FORWARD]
        self.order = fwd + [o for o in order if graph.ops[o].phase is not Phase.FORWARD]
        self.n, self.nf = len(self.order), len(fwd)
        self.pos = {o: i for i, o in enumerate(self.order)}
        self.times = [float(self.cost.op_time(graph.ops[o])) for o in self.order]
        self.copy_engines = int(self.cost.copy_engines)
        self.activations = {t.id for t in graph.activations() if t.kind is not TensorKind.OUTPUT}
        self.features = self._features() if features is None else list(features)
        self.size = {x: graph.tensors[x].nbytes for x in self.features}
        self.all_swap: dict[int, FeatureClass] = dict.fromkeys(self.features, SWAP)
        self._uses()
        self.out_time = {x: float(self.cost.transfer_time(self.size[x], "d2h"))
                         for x in self.features}
        self.in_time = {x: float(self.cost.transfer_time(self.size[x], "h2d"))
                        for x in self.features}
        #: storages a recompute chain never re-makes (static tensors and graph outputs)
        self._static = {t.storage for t in graph.tensors
                        if t.kind in STATIC_KINDS or t.kind is TensorKind.OUTPUT}
        self.chains = {x: self._chain(x) for x in self.features}
        base = np.array(memory_per_step(graph, self.order), dtype=np.float64)
        for x in self.features:
            base[self.last_fwd[x] + 1:self.last_bwd[x] + 1] -= self.size[x]
        self.base = base
        self.base_list: list[float] = base.tolist()  # scalar reads in Python (same values)
        self.after_fwd = [self.last_fwd[x] + 1 for x in self.features]
        self.backward_times = np.array(self.times[self.nf:-1], dtype=np.float64)
        self.out_bytes = np.array([sum(graph.tensors[t].nbytes for t in graph.ops[o].outputs)
                                   for o in self.order], dtype=np.float64)
        self.produced_at: dict[int, list[int]] = {}
        self.leaves_at: dict[int, list[int]] = {}
        for x in self.features:
            self.produced_at.setdefault(self.prod[x], []).append(x)
            self.leaves_at.setdefault(self.last_fwd[x], []).append(x)
        #: per forward position: base bytes, op time, maps made, maps past their last use
        self.forward_steps = [(self.base_list[j], self.times[j], tuple(self.produced_at.get(j, ())),
                               tuple(self.leaves_at.get(j, ()))) for j in range(self.nf)]

    # ---- set-up -----------------------------------------------------------------------------
    def _features(self) -> list[int]:
        g = self.graph
        pinned = {t.storage for t in g.tensors if t.is_view and t.producer is not None
                  and g.ops[t.producer].category is not OpCategory.VIEW}
        acts = [x for x in self.activations if x not in pinned]
        largest = max((g.tensors[x].nbytes for x in acts), default=0)
        keep = [x for x in acts if g.tensors[x].nbytes >= largest * FEATURE_FRACTION and largest]
        return sorted(keep, key=lambda x: self.pos[producer(g, x)])

    def _uses(self) -> None:
        g = self.graph
        self.prod: dict[int, int] = {}
        self.last_fwd: dict[int, int] = {}
        self.first_bwd: dict[int, int] = {}
        self.last_bwd: dict[int, int] = {}
        readers: dict[int, list[int]] = {}
        for t in g.tensors:
            readers.setdefault(t.storage, []).extend(self.pos[c] for c in t.consumers)
        #: last use of every activation storage (features or not), for recompute chains
        self.last_use = {a: max(readers.get(a, [self.pos[producer(g, a)]]))
                         for a in self.activations}
        for x in self.features:
            p = self.pos[producer(g, x)]
            uses = readers.get(x, [])
            fwd = [u for u in uses if u < self.nf]
            bwd = sorted(u for u in uses if u >= self.nf)
            self.prod[x] = p
            self.last_fwd[x] = max(fwd, default=p)
            self.first_bwd[x] = bwd[0]
            self.last_bwd[x] = bwd[-1]

    def _chain(self, x: int) -> Chain:
        """The ops a recompute of ``x`` re-runs: its producer, and the producers of every
        dropped forward intermediate it reads, down to activations or static tensors."""
        g = self.graph
        static = self._static
        ops: list[int] = []
        reads: list[int] = []
        seen: set[int] = set()

        def visit(op_id: int) -> None:
            if op_id in seen:
                return
            seen.add(op_id)
            for u in g.ops[op_id].inputs:
                s = g.tensors[u].storage
                if s in static:
                    continue
                if s in self.activations and s != x:
                    if s not in reads:
                        reads.append(s)
                    if u == s:
                        continue
                visit(producer(g, u))
            ops.append(op_id)

        visit(producer(g, x))
        ops.sort(key=self.pos.__getitem__)
        made = {o for op in ops for o in g.ops[op].outputs}
        transient = 0
        for op in ops:
            outs = sum(g.tensors[o].nbytes for o in g.ops[op].outputs if o != x)
            ins = sum(g.tensors[g.tensors[u].storage].nbytes for u in g.ops[op].inputs
                      if g.tensors[u].storage in made and g.tensors[u].storage != x)
            transient = max(transient, outs + ins)
        return Chain(tuple(ops), sum(self.times[self.pos[o]] for o in ops), transient,
                     tuple(reads))


@dataclass
class Evaluation:
    """One simulated step under a classification."""

    time: float
    peak: float
    feasible: bool
    forward_end: float
    classes: dict[int, FeatureClass]
    copy_out_end: dict[int, float] = field(default_factory=dict)
    copy_in_stall: dict[int, float] = field(default_factory=dict)
    forward_stall: dict[int, float] = field(default_factory=dict)
    free_at: dict[int, int] = field(default_factory=dict)  # swapped map -> position freed before
    issue_at: dict[int, int] = field(default_factory=dict)  # swapped map -> copy-in position
    need_at: dict[int, int] = field(default_factory=dict)  # map -> first backward need
    last_at: dict[int, int] = field(default_factory=dict)  # map -> last backward use
    release_wait: dict[int, float] = field(default_factory=dict)  # position -> copy-out waited for


#: ``swap_in_at(profile, x, lo, need, memory, budget) -> position`` for one swapped map.
SwapInRule = Callable[[Profile, int, int, int, np.ndarray, float], int]


def earliest_fit(profile: Profile, x: int, lo: int, need: int, memory: np.ndarray,
                 budget: float) -> int:
    """PoocH §4.3: the earliest position in [lo, need] from which the map fits in memory
    until its use (``need`` when even that overflows): one past the last position of the
    window where it would overflow (adding the map's size is monotone, so this is the
    first position whose suffix maximum fits)."""
    window = memory[lo:need + 1]
    if not len(window):
        return need
    over = (window + profile.size[x] > budget)[::-1]  # from the end: the last overflow first
    k = int(over.argmax())
    if not over[k]:
        return lo
    return need if k == 0 else lo + len(window) - k


def evaluate(p: Profile, classes: Mapping[int, FeatureClass], budget: float, *,
             swap_in_at: SwapInRule = earliest_fit, sync_forward: bool | None = False,
             strict: bool = True, resume: ForwardState | None = None) -> Evaluation:
    """Replay ``classes`` (feature map -> keep / swap / recompute; absent = swap).

    With ``strict`` an overflow stops the replay (``feasible`` False); otherwise the replay
    goes on past the budget (to price a classification that ignores memory, PoocH's r(X)).
    ``sync_forward=None`` replays without the end-of-forward wait and, if that overflows
    (maps whose copy-out outlives forward are needed before it ends and so stay), with it.
    ``resume`` (``ForwardPrefixes.at``): the forward replay starts from that state instead
    of position 0; the caller guarantees ``classes`` agrees with the classification it was
    recorded on for every map made before its position (the result is then the same).
    """
    if sync_forward is None:
        first = evaluate(p, classes, budget, swap_in_at=swap_in_at, sync_forward=False,
                         strict=strict, resume=resume)
        if first.feasible or not strict or first.peak == math.inf:
            # peak inf: the forward replay overflowed, and it does not depend on the
            # end-of-forward wait, so the second replay would overflow there too (and
            # ``first`` is returned either way)
            return first
        second = evaluate(p, classes, budget, swap_in_at=swap_in_at, sync_forward=True,
                          strict=strict, resume=resume)
        return second if second.feasible else first
    cls = _every_feature(p, classes)
    ev = Evaluation(0.0, 0.0, True, 0.0, cls)
    t, d2h = _forward(p, cls, budget, ev, strict, resume)
    if not ev.feasible:
        ev.time = ev.peak = float("inf")
        return ev
    h2d = 0.0 if p.copy_engines >= 2 else d2h
    _release_after_forward(p, cls, ev, t, sync_forward)
    if sync_forward:
        t = max([t] + [ev.copy_out_end[x] for x in cls if cls[x] == SWAP])
    memory = _backward_memory(p, cls, ev, budget, swap_in_at, strict)
    ev.peak = max(float(memory.max()) if len(memory) else 0.0, _remake_peak(p, cls, ev, memory))
    if strict and ev.peak > budget:
        ev.feasible = False
        ev.time = float("inf")
        return ev
    t, h2d = _backward_time(p, cls, ev, t, h2d)
    ev.time = max(t, h2d, d2h)
    return ev


def _every_feature(p: Profile, classes: Mapping[int, FeatureClass]) -> dict[int, FeatureClass]:
    """``classes`` on every feature map of ``p``, in their order (absent = swap), and on
    nothing else."""
    cls = dict(p.all_swap)
    cls.update(classes)
    if len(cls) != len(p.all_swap):  # ``classes`` names more than the features
        cls = {x: classes.get(x, SWAP) for x in p.features}
    return cls


@dataclass(frozen=True)
class ForwardState:
    """The forward replay's state before position ``j`` (``ForwardPrefixes``)."""

    j: int
    t: float
    d2h: float
    ext: float
    pending: tuple[tuple[float, int], ...]
    free_at: dict[int, int]
    copy_out_end: dict[int, float]
    forward_stall: dict[int, float]


class ForwardPrefixes:
    """Forward states of one classification at chosen positions, to replay classifications
    that differ from it in one map ``x`` from ``x``'s producer on (PoocH's step 2 prices
    every swapped map against one classification).

    Before position ``prod[x]`` the forward replay reads no map's class but those made
    earlier (``_forward``: a class is read when its map is made or leaves), so a
    classification equal to ``classes`` on those maps reaches the same state there. The
    states come from a replay that goes on past the budget; a strict replay is the same
    up to the first position where it stops (``fail``), so ``at`` gives no state beyond it.
    """

    def __init__(self, p: Profile, classes: Mapping[int, FeatureClass], budget: float,
                 positions: set[int]) -> None:
        cls = _every_feature(p, classes)
        self.states: dict[int, ForwardState] = {}
        self.fail = p.nf
        _forward(p, cls, budget, Evaluation(0.0, 0.0, True, 0.0, cls), False, None, self,
                 positions)

    def at(self, p: Profile, x: int, strict: bool) -> ForwardState | None:
        """The state to replay a classification differing from this one only in ``x``
        from (None: from position 0)."""
        j = p.prod[x]
        if strict and j > self.fail:
            return None
        return self.states.get(j)


def _forward(p: Profile, cls: dict[int, FeatureClass], budget: float, ev: Evaluation,
             strict: bool, resume: ForwardState | None = None,
             record: ForwardPrefixes | None = None,
             positions: set[int] | None = None) -> tuple[float, float]:
    """Forward timeline; fills copy-out ends, release positions and memory stalls. From
    ``resume``'s position and state when given; ``record`` (with ``positions``) keeps the
    state before each of ``positions`` and the first position a strict replay stops at."""
    t, d2h, ext, j0 = 0.0, 0.0, 0.0, 0
    pending: list[tuple[float, int]] = []  # (copy-out end, map): swapped, past last forward use
    if resume is not None:
        t, d2h, ext, j0, pending = resume.t, resume.d2h, resume.ext, resume.j, [*resume.pending]
        ev.free_at.update(resume.free_at)
        ev.copy_out_end.update(resume.copy_out_end)
        ev.forward_stall.update(resume.forward_stall)
    size, out_time = p.size, p.out_time
    free_at, copy_out_end = ev.free_at, ev.copy_out_end
    steps = p.forward_steps if j0 == 0 else p.forward_steps[j0:]
    for j, (base, dt, made, leaving) in enumerate(steps, j0):
        if record is not None and positions is not None and j in positions:
            record.states[j] = ForwardState(j, t, d2h, ext, tuple(pending), dict(free_at),
                                            dict(copy_out_end), dict(ev.forward_stall))
        while pending and pending[0][0] <= t:
            _, x = heapq.heappop(pending)
            ext -= size[x]
            free_at[x] = j
        need = base + ext
        while need > budget and pending:
            end, x = heapq.heappop(pending)
            ev.forward_stall[x] = max(0.0, end - t)
            t = max(t, end)
            ext -= size[x]
            need -= size[x]
            free_at[x] = j
        if need > budget:
            if strict:
                ev.feasible = False
                ev.peak = need
                return t, d2h
            if record is not None:
                record.fail = min(record.fail, j)
        t += dt
        for x in made:
            if cls[x] == SWAP:
                start = max(t, d2h)
                d2h = start + out_time[x]
                copy_out_end[x] = d2h
        for x in leaving:
            c = cls[x]
            if c == KEEP:
                ext += size[x]
            elif c == SWAP:
                if copy_out_end[x] <= t:
                    free_at[x] = j + 1
                else:
                    ext += size[x]
                    heapq.heappush(pending, (copy_out_end[x], x))
    ev.forward_end = t
    return t, d2h


def _release_after_forward(p: Profile, cls: dict[int, FeatureClass], ev: Evaluation, t: float,
                           sync_forward: bool) -> None:
    """Release positions of maps whose copy-out outlived forward: the first backward op
    predicted to start after the copy ended (or the first backward op, with a sync)."""
    late = [x for x in p.features if cls[x] == SWAP and x not in ev.free_at]
    if not late:
        return
    starts = np.cumsum(np.concatenate(([t], p.backward_times))) if p.n > p.nf else np.array([t])
    for x in late:
        if sync_forward:
            ev.free_at[x] = p.nf
        else:
            k = int(np.searchsorted(starts, ev.copy_out_end[x], side="left"))
            ev.free_at[x] = p.nf + k


def _backward_memory(p: Profile, cls: dict[int, FeatureClass], ev: Evaluation, budget: float,
                     swap_in_at: SwapInRule, strict: bool) -> np.ndarray:
    """The memory profile with every map's residency; chooses copy-in positions.

    Residency intervals are summed in one difference array: bytes are whole numbers far
    below 2**53, so float64 sums are exact in any order (the profile equals slice-by-slice
    addition)."""
    spans: list[tuple[int, int, float]] = []  # [start, end) gets +bytes
    need = dict(p.first_bwd)  # keyed by the features, in their order
    last = dict(p.last_bwd)
    size, free_at = p.size, ev.free_at
    for x in [x for x in reversed(p.features) if cls[x] == RECOMPUTE]:
        for y in p.chains[x].reads:  # later maps first: their chains read earlier ones
            if y in need:
                need[y] = min(need[y], need[x])
                last[y] = max(last[y], need[x])
            elif need[x] > p.last_use[y]:  # a kept small activation read by the chain
                spans.append((p.last_use[y] + 1, need[x] + 1, p.graph.tensors[y].nbytes))
    ev.need_at = need
    ev.last_at = last
    swapped = []
    for x, lo in zip(p.features, p.after_fwd, strict=True):
        c = cls[x]
        if c == KEEP:
            spans.append((lo, last[x] + 1, size[x]))
        elif c == RECOMPUTE:
            spans.append((need[x], last[x] + 1, size[x]))
        elif free_at[x] > need[x] or free_at[x] > last[x]:  # never left: kept in effect
            spans.append((lo, last[x] + 1, size[x]))
            free_at.pop(x)
            cls[x] = KEEP
        else:
            spans.append((lo, free_at[x], size[x]))
            swapped.append(x)
    memory = p.base + span_sum(spans, len(p.base))
    _release_when_short(p, ev, memory, budget, swapped)
    swapped.sort(key=lambda x: (need[x], p.prod[x]))
    floor = p.nf
    # earliest_fit inlined: bytes are whole numbers below 2**53, so with a whole budget
    # ``m + size > budget`` is ``m > budget - size`` exactly (one array operation fewer)
    fit = swap_in_at is earliest_fit
    whole = math.isfinite(budget) and float(budget).is_integer()
    for x in swapped:
        lo, at_most = max(floor, free_at[x]), need[x]
        if fit:
            at = at_most
            if lo <= at_most:
                window = memory[lo:at_most + 1]
                over = (window > budget - size[x] if whole else window + size[x] > budget
                        ).nonzero()[0]
                if not over.size:
                    at = lo
                elif over[-1] < at_most - lo:
                    at = lo + int(over[-1]) + 1
        else:
            at = min(max(swap_in_at(p, x, lo, at_most, memory, budget), lo), at_most)
        ev.issue_at[x] = at
        floor = at
        memory[at:last[x] + 1] += size[x]
    return memory


def span_sum(spans: list[tuple[int, int, float]], n: int) -> np.ndarray:
    """``out[i]`` = the bytes of every span ``[start, end)`` holding ``i`` (spans clipped to
    ``[0, n)`` as slices are; empty ones add nothing)."""
    if not spans:
        return np.zeros(n)
    starts, ends, sizes = (np.array(col) for col in zip(*spans, strict=True))
    starts, ends = np.clip(starts, 0, n), np.clip(ends, 0, n)
    live = ends > starts
    sizes = np.where(live, sizes, 0.0)
    diff = (np.bincount(starts, weights=sizes, minlength=n + 1)
            - np.bincount(ends, weights=sizes, minlength=n + 1))
    return np.cumsum(diff[:n])


def _remake_peak(p: Profile, cls: dict[int, FeatureClass], ev: Evaluation,
                 memory: np.ndarray) -> float:
    """The memory while recomputes run before their op: what is resident before the op
    (its own outputs not made yet) plus the chain's intermediates."""
    peak = 0.0
    for x in p.features:
        if cls[x] == RECOMPUTE:
            j = ev.need_at[x]
            peak = max(peak, memory[j] - p.out_bytes[j] + p.chains[x].transient)
    return peak


def _release_when_short(p: Profile, ev: Evaluation, memory: np.ndarray, budget: float,
                        swapped: list[int]) -> None:
    """A map still being copied out after forward holds memory until its copy ends; where
    backward would overflow before that, the compute stream waits for the copy there and
    releases the map (earliest-ending copies first)."""
    late = sorted((x for x in swapped if ev.free_at[x] > p.nf), key=ev.copy_out_end.__getitem__)
    for x in late:
        over = np.flatnonzero(memory[p.nf:ev.free_at[x]] > budget)
        if over.size:
            k = p.nf + int(over[0])
            memory[k:ev.free_at[x]] -= p.size[x]
            ev.free_at[x] = k
            ev.release_wait[k] = max(ev.release_wait.get(k, 0.0), ev.copy_out_end[x])


def _backward_time(p: Profile, cls: dict[int, FeatureClass], ev: Evaluation, t: float,
                   h2d: float) -> tuple[float, float]:
    """Backward timeline: copy-ins in issue order, waits, recomputes, ops."""
    issued: dict[int, list[int]] = {}
    for x, at in ev.issue_at.items():
        issued.setdefault(at, []).append(x)
    waits: dict[int, list[int]] = {}
    remakes: dict[int, list[int]] = {}
    for x in p.features:
        if cls[x] == SWAP:
            waits.setdefault(ev.need_at[x], []).append(x)
        elif cls[x] == RECOMPUTE:
            remakes.setdefault(ev.need_at[x], []).append(x)
    arrive: dict[int, float] = {}
    times, pos, release = p.times, p.pos, ev.release_wait
    events = sorted({j for j in (*release, *issued, *waits, *remakes) if p.nf <= j < p.n})
    j0 = p.nf
    for j in events:  # the same float operations in the same order as op by op
        for dt in times[j0:j]:
            t += dt
        j0 = j + 1
        if j in release:
            t = max(t, release[j])
        if j in issued:
            for x in issued[j]:  # (need, producer) order: _backward_memory fills issue_at so
                start = max(t, h2d, ev.copy_out_end[x])
                h2d = start + p.in_time[x]
                arrive[x] = h2d
        if j in waits:
            for x in waits[j]:
                ev.copy_in_stall[x] = max(0.0, arrive[x] - t)
                t = max(t, arrive[x])
        if j in remakes:
            rerun = {op for x in remakes[j] for op in p.chains[x].ops}
            t += sum(times[pos[op]] for op in rerun)
        t += times[j]
    for dt in times[j0:p.n]:
        t += dt
    return t, h2d
