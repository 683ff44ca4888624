"""The planning problem as plain data: stages, op times, the in-core memory curve, and per
movable activation its size, interval and prices (no torch, no solver).

Stages are the ops in the order ``outcore.plan.lower`` runs them (forward ops, then the
rest). ``memory[s]`` is the device bytes the memory rule (``outcore.plan.residency``, via
``plan.memory.memory_curve``) records right after ``Compute`` of stage ``s`` when every
activation is kept and freed at its last use. That schedule's peak is at a Compute sample
(only Computes allocate in it).

For a movable activation (storage) ``i`` with producer at stage ``p``, last forward use
``f`` (``p`` when forward reads it nowhere else) and first backward use ``b``, any Plan
lowered by ``lower`` keeps ``i`` resident at every Compute sample outside ``(f, b)``; inside
it, an OFFLOAD frees it until its prefetch is issued (before Compute of stage ``q``) and a
RECOMPUTE frees it until ``b``. Activations with an empty gap (``b == f + 1``) are left out:
no plan can free them at any Compute sample.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from outcore.cost.model import CostModel
from outcore.graph.ir import STATIC_KINDS, Graph, OpCategory, Phase
from outcore.plan.lower import HEAVY, forward_intermediates, lower
from outcore.plan.memory import memory_curve
from outcore.plan.plan import Plan
from outcore.plan.schedule import Compute
from outcore.policies.baseline import movable_activations

#: When the candidates' gaps hold at most this many stages in all, the bound model offers
#: every stage as a prefetch point (exact); beyond, ``BOUND_OPTIONS`` heavy stages.
EVERY_STAGE_LIMIT = 4000
BOUND_OPTIONS = 12


#: Release points of an offload (``Candidate.release``): when the candidates' forward tails
#: hold at most this many stages in all, every forward stage after ``last_forward + 1``;
#: beyond, the heavy forward stages at these positions after it (primal; the bound model's
#: intervals end at ``BOUND_RELEASE_PICKS`` and at the last forward stage).
RELEASE_EVERY_LIMIT = 300
RELEASE_PICKS = (0, 1, 2, 4, 7)
BOUND_RELEASE_PICKS = (0, 1, 2, 3, 4, 6, 8, 12, 16)

#: How many levels of freed inputs the bound model follows behind a recompute (deeper
#: re-makes are free there: a relaxation).
CHAIN_DEPTH = 4


class DeadInput(NamedTuple):
    """A freed forward tensor a recompute needs (bound model). ``maker`` is the op that
    re-makes it (-1 when lowering cannot: it must be kept alive), ``seconds`` that op's
    time, ``needed_by`` -1 when the candidate's own producer reads it, else the ``maker``
    of the freed input whose re-make reads it. ``leaves``: the candidates (by tensor id)
    among ``maker``'s inputs whose gap contains the candidate's ``first_backward``: a
    re-make by then needs them resident (``leaf_residency``)."""

    storage: int
    nbytes: int
    last: int
    maker: int
    seconds: float
    needed_by: int
    leaves: tuple[int, ...] = ()


@dataclass(frozen=True)
class Candidate:
    """One movable activation (a base tensor and its views' storage).

    ``options`` are the stages before whose Compute its prefetch may be issued (increasing,
    the last is ``first_backward``: just in time); ``bound_options`` those of the bound
    model, where option ``j`` stands for every stage in ``(bound_options[j-1],
    bound_options[j]]``. ``recompute`` is the primal price of
    recomputing it (its producer's time) or None when the primal model may not recompute it
    (a view, or an input that is not resident at ``first_backward`` in the in-core schedule
    and not re-made by a chain: lowering would extend that input's life; a random producer,
    dropout, is recomputed with its forward RNG state replayed, as outcore-checkpoint's
    plans are, and the state's bytes are in the memory rule); ``recompute_floor`` is a
    price no plan can beat (the producer's time shared among its movable outputs).
    ``leaves`` are the candidates (by tensor id) among the producer's inputs whose gap
    contains ``first_backward``: they must be resident when the recompute runs.
    ``chain`` are forward intermediates (storages) the primal recompute re-makes first (an
    input the in-core schedule has freed by ``first_backward``, rebuilt from inputs that are
    resident then); the plan marks them RECOMPUTE too, and ``recompute`` includes their
    producers' times. ``dead_inputs`` lists, for the bound model, every such freed input:
    ``DeadInput``, with the freed inputs re-making it needs in turn.
    ``release`` are the later forward stages before whose Compute an offload may be waited
    for and freed instead of ``last_forward + 1`` (``Plan.release_at``; increasing, all
    before the first backward stage); ``bound_release`` those of the bound model, where
    option ``j`` stands for every stage in ``(bound_release[j-1], bound_release[j]]``
    (``bound_release[-1]`` read as ``last_forward + 1``) and the last is the last forward
    stage, so that every release point lowering accepts is covered.
    """

    tensor: int
    nbytes: int
    produce: int
    last_forward: int
    first_backward: int
    d2h: float
    h2d: float
    recompute: float | None
    recompute_floor: float
    leaves: tuple[int, ...]
    options: tuple[int, ...]
    bound_options: tuple[int, ...] = ()
    dead_inputs: tuple[DeadInput, ...] = ()
    chain: tuple[int, ...] = ()
    bound_leaves: tuple[int, ...] = ()  # the producer's own inputs whose gap contains b
    release: tuple[int, ...] = ()
    bound_release: tuple[int, ...] = ()


@dataclass(frozen=True)
class Problem:
    """Everything the formulation reads; ``op_order[s]`` is the op id of stage ``s``."""

    op_order: tuple[int, ...]
    op_time: tuple[float, ...]
    memory: tuple[int, ...]
    budget: int
    candidates: tuple[Candidate, ...]
    copy_engines: int
    #: stages of the forward pass (the first backward stage); 0: unknown
    forward_stages: int = 0

    @property
    def stages(self) -> int:
        return len(self.op_order)

    @property
    def in_core_time(self) -> float:
        return float(sum(self.op_time))

    @property
    def in_core_peak(self) -> int:
        return max(self.memory, default=0)


def stage_order(graph: Graph) -> list[int]:
    """Op ids in the order ``lower`` runs them (forward first, then the rest)."""
    fwd = [op.id for op in graph.ops if op.phase is Phase.FORWARD]
    return fwd + [op.id for op in graph.ops if op.phase is not Phase.FORWARD]


def build_problem(graph: Graph, cost: CostModel, budget: int, *,
                  options: int = 6) -> Problem:
    """Extract the plain data of planning ``graph`` under ``budget`` on ``cost``.

    ``options`` bounds how many prefetch stages each candidate may choose from (the last
    ``options - 1`` heavy backward stages before its first backward use, plus that use).
    """
    bind = getattr(cost, "bind", None)
    model: CostModel = bind(graph) if callable(bind) else cost
    order = stage_order(graph)
    stage_of = {oid: s for s, oid in enumerate(order)}
    op_time = tuple(float(model.op_time(graph.ops[oid])) for oid in order)
    keep = lower(graph, Plan(policy="in-core"))
    trace = memory_curve(graph, keep)
    memory = [0] * len(order)
    for i, ins in enumerate(keep.instructions):
        if isinstance(ins, Compute):
            memory[stage_of[ins.op]] = trace.device[i]
    first_bwd = sum(1 for op in graph.ops if op.phase is Phase.FORWARD)
    heavy = [s for s in range(first_bwd, len(order))
             if graph.ops[order[s]].category in HEAVY]
    spans = _storage_spans(graph, stage_of)
    movable = movable_activations(graph)
    per_producer: dict[int, int] = {}
    for tid in movable:
        op = graph.tensors[tid].producer
        if op is not None:
            per_producer[op] = per_producer.get(op, 0) + 1
    raw: list[tuple[int, int, int, int]] = []
    for tid in movable:
        p, f, b, _ = spans[tid]
        if b is None or b <= f + 1:
            continue
        raw.append((tid, p, f, b))
    gaps = {tid: (f, b) for tid, _, f, b in raw}
    movable_set = set(movable)
    rebuildable = forward_intermediates(graph) - movable_set  # backward never reads them
    every_stage = sum(b - f for _, _, f, b in raw) <= EVERY_STAGE_LIMIT
    heavy_fwd = [s for s in range(first_bwd) if graph.ops[order[s]].category in HEAVY]
    every_release = sum(max(0, first_bwd - f - 2) for _, _, f, _ in raw) <= RELEASE_EVERY_LIMIT
    cands = []
    for tid, p, f, b in raw:
        producer = graph.producer_op(tid)
        nbytes = graph.tensors[tid].nbytes
        price, leaves, chain = _recompute_price(graph, producer.id, b, op_time, stage_of,
                                                spans, gaps, rebuildable)
        cands.append(Candidate(
            tensor=tid, nbytes=nbytes, produce=p, last_forward=f, first_backward=b,
            d2h=float(model.transfer_time(nbytes, "d2h")),
            h2d=float(model.transfer_time(nbytes, "h2d")),
            recompute=price, leaves=leaves, chain=chain,
            bound_leaves=_direct_leaves(graph, producer.id, b, gaps),
            recompute_floor=op_time[stage_of[producer.id]] / per_producer[producer.id],
            options=_options(heavy, f, b, options),
            release=_release(heavy_fwd, f, first_bwd, every_release, RELEASE_PICKS, False),
            bound_release=_release(heavy_fwd, f, first_bwd, every_release,
                                   BOUND_RELEASE_PICKS, True),
            bound_options=tuple(range(f + 1, b + 1)) if every_stage
            else _options(heavy, f, b, BOUND_OPTIONS),
            dead_inputs=_dead_inputs(graph, producer.id, b, spans, movable_set,
                                     rebuildable, op_time, stage_of, gaps)))
    return Problem(tuple(order), op_time, tuple(memory), budget, tuple(cands),
                   int(model.copy_engines), first_bwd)


def _storage_spans(graph: Graph, stage_of: dict[int, int]
                   ) -> dict[int, tuple[int, int, int | None, int]]:
    """Storage id -> (producer stage, last forward use, first backward use or None, last use)
    over every tensor of the storage (views included)."""
    spans: dict[int, tuple[int, int, int | None, int]] = {}
    for storage, members in graph.aliases().items():
        base = graph.tensors[storage]
        if base.producer is None or base.kind in STATIC_KINDS:
            continue
        p = stage_of[base.producer]
        forward = [p]
        backward: list[int] = []
        for tid in members:
            for c in graph.tensors[tid].consumers:
                (forward if graph.ops[c].phase is Phase.FORWARD else backward).append(stage_of[c])
        last = max(forward + backward)
        spans[storage] = (p, max(forward), min(backward) if backward else None, last)
    return spans


def _recompute_price(graph: Graph, producer: int, b: int, op_time: tuple[float, ...],
                     stage_of: dict[int, int],
                     spans: dict[int, tuple[int, int, int | None, int]],
                     gaps: dict[int, tuple[int, int]], rebuildable: set[int]
                     ) -> tuple[float | None, tuple[int, ...], tuple[int, ...]]:
    """The primal price of recomputing an output of ``producer`` before stage ``b``, the
    candidates that must then be resident, and the chain re-made first (see ``Candidate``).
    A freed input is re-made when it is a forward intermediate, recursively up to
    ``CHAIN_DEPTH`` levels, until inputs alive at ``b``; otherwise the primal model may not
    recompute (None)."""
    op = graph.ops[producer]
    if op.category is OpCategory.VIEW:  # random ops re-run with their forward RNG state
        return None, (), ()
    price = op_time[stage_of[producer]]
    leaves: list[int] = []
    chain: list[int] = []
    frontier = [producer]
    for depth in range(CHAIN_DEPTH + 1):
        nxt: list[int] = []
        for op_id in frontier:
            for inp in graph.ops[op_id].inputs:
                t = graph.tensors[inp]
                if t.kind in STATIC_KINDS or t.storage in chain:
                    continue
                if _alive_at(spans, t.storage, b):
                    _add_leaf(leaves, gaps, t.storage, b)
                    continue
                maker = graph.tensors[t.storage].producer
                if depth == CHAIN_DEPTH or t.storage not in rebuildable or maker is None:
                    return None, (), ()  # lowering would keep it alive instead
                chain.append(t.storage)
                price += op_time[stage_of[maker]]
                nxt.append(maker)
        frontier = nxt
    return price, tuple(sorted(set(leaves))), tuple(chain)


def _direct_leaves(graph: Graph, producer: int, b: int,
                   gaps: dict[int, tuple[int, int]]) -> tuple[int, ...]:
    """Candidates among ``producer``'s inputs whose gap contains ``b``: a recompute before
    ``b`` finds them resident, or brings them back (prefetch or recompute) for itself."""
    leaves: list[int] = []
    for inp in graph.ops[producer].inputs:
        _add_leaf(leaves, gaps, graph.tensors[inp].storage, b)
    return tuple(sorted(set(leaves)))


def _alive_at(spans: dict[int, tuple[int, int, int | None, int]], storage: int, b: int) -> bool:
    span = spans.get(storage)
    return span is not None and span[0] <= b <= span[3]


def _add_leaf(leaves: list[int], gaps: dict[int, tuple[int, int]], storage: int, b: int) -> None:
    gap = gaps.get(storage)
    if gap is not None and gap[0] < b < gap[1]:
        leaves.append(storage)


def _dead_inputs(graph: Graph, producer: int, b: int,
                 spans: dict[int, tuple[int, int, int | None, int]],
                 movable: set[int], rebuildable: set[int], op_time: tuple[float, ...],
                 stage_of: dict[int, int], gaps: dict[int, tuple[int, int]]
                 ) -> tuple[DeadInput, ...]:
    """Inputs of ``producer`` that no policy may move and that the in-core schedule frees
    before stage ``b``, and (up to ``CHAIN_DEPTH`` levels) the freed inputs of their
    producers, which re-making them needs in turn (see ``DeadInput``)."""
    out: dict[tuple[int, int], DeadInput] = {}
    frontier = [(producer, -1)]
    for _ in range(CHAIN_DEPTH):
        nxt = []
        for op_id, needed_by in frontier:
            for inp in graph.ops[op_id].inputs:
                t = graph.tensors[inp]
                span = spans.get(t.storage)
                if (t.kind in STATIC_KINDS or span is None or t.storage in movable
                        or span[3] >= b or (t.storage, needed_by) in out):
                    continue
                maker = graph.tensors[t.storage].producer
                if t.storage not in rebuildable or maker is None:
                    maker = -1
                seconds = op_time[stage_of[maker]] if maker >= 0 else 0.0
                out[(t.storage, needed_by)] = DeadInput(
                    t.storage, graph.tensors[t.storage].nbytes, span[3], maker, seconds,
                    needed_by, _direct_leaves(graph, maker, b, gaps) if maker >= 0 else ())
                if maker >= 0:
                    nxt.append((maker, maker))
        frontier = nxt
    return tuple(out.values())


def _options(heavy: list[int], f: int, b: int, count: int) -> tuple[int, ...]:
    """Prefetch stages for a candidate: up to ``count - 1`` heavy backward stages in
    ``(f, b)`` closest to ``b``, then ``b`` itself."""
    import bisect

    hi = bisect.bisect_left(heavy, b)
    lo = bisect.bisect_right(heavy, f)
    early = heavy[max(lo, hi - (count - 1)):hi]
    return (*early, b)


def _release(heavy_fwd: list[int], f: int, first_bwd: int, every: bool,
             picks: tuple[int, ...], cover: bool) -> tuple[int, ...]:
    """Release stages for a candidate whose last forward use is ``f`` (see ``Candidate``):
    every forward stage in ``(f + 1, first_bwd)`` when ``every``, else the heavy forward
    stages there at positions ``picks``; ``cover`` adds the last forward stage (the bound
    model's intervals must reach it)."""
    import bisect

    if every:
        return tuple(range(f + 2, first_bwd))
    after = heavy_fwd[bisect.bisect_right(heavy_fwd, f + 1):]
    chosen = [after[i] for i in picks if i < len(after)]
    if cover and first_bwd - 1 > f + 1 and (not chosen or chosen[-1] < first_bwd - 1):
        chosen.append(first_bwd - 1)
    return tuple(chosen)
