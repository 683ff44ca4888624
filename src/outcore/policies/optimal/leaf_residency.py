"""Bound model: what a recompute reads is resident when it runs, and stays resident.

A recompute before stage ``b`` (of a candidate ``k``, ``b = b_k``; or a re-make ``z_(m,b)``
of a freed forward intermediate by its maker ``m``, ``formulation``'s recompute chains)
runs its op on that op's inputs. Each input ``u`` that is a candidate whose gap contains
``b`` (``Candidate.bound_leaves``, ``DeadInput.leaves``) is then resident: kept, prefetched
by then, or re-made by then when ``u`` is recomputed itself. The bound model used to say
only ``r_k + (u offloaded past b) - r_u <= 1``, and went on counting a recomputed leaf as
freed until its own ``b_u``, so a chain of recomputes held nothing at ``b``; and a
re-make ``z`` needed nothing at all. At ResNet-50 b256's lowest budget (v100-pcie,
``r50b256-floor``) the LP recomputed chains of 0.77 GiB tensors that way.

Columns ``w_(u,s)`` in ``[0, 1]`` for each candidate ``u`` and each stage ``s`` in
``S_u``, the stages ``b`` some recompute or re-make needing ``u`` is due at (sorted):
``u`` is recomputed and re-made at or before stage ``s``. Rows:

* ``w_(u,s_1) <= w_(u,s_2) <= ... <= r_u`` (cumulative, like the prefetch columns);
* memory: ``w_(u,s_i)`` adds ``size_u`` at the samples of ``[s_i, s_(i+1))`` (the last
  until ``b_u``, where ``r_u`` stops freeing it), so ``u`` counts as resident from its
  first re-make on;
* per need ``(n, b, u)`` (``n`` the column of the recompute ``r_k`` or re-make ``z``):
  ``n + r_u - w_(u,b) + y_u,later <= 1``, ``y_u,later`` the offload share whose prefetch
  option lies wholly after ``b`` (``u`` still freed at ``b``); the old leaf row without
  its ``-r_u`` and with the re-make.

Why it stays a lower bound. Take a Plan lowered by ``outcore.plan.lower`` and its point of
the bound model (``formulation``'s derivation), and set ``w_(u,s) = 1`` exactly when ``u``
is recomputed and its first re-make in backward runs before Compute of a stage ``t_u <=
s``. The chain rows hold (``w`` grows with ``s``, and is 0 unless ``r_u = 1``). Memory:
``lower`` re-makes ``u`` (``_sequence.ensure``) when something needs it and ``u`` is not
resident, and frees it only after the last use of that residency (``_insert_frees``), which
is ``u``'s own backward use at ``b_u`` or later; so ``u`` is resident at every Compute sample
of ``[t_u, b_u)``. The model holds it at the samples of ``[s, b_u)``, ``s`` the first stage
of ``S_u`` at or after ``t_u``: a subset, so the model frees at least the bytes the plan
frees at every sample and the memory rows stay met. Need rows: if ``n = 1`` the op runs
before Compute of a stage ``t <= b`` (``r_k``: at ``b_k``, or earlier when another recompute
re-makes ``k`` first, the model's convention; ``z_(m,b)``: at or before ``b``, by its
definition), and ``lower`` makes every input resident before it. ``u``'s gap contains
``b``, so it was freed in forward (at or before ``f_u + 1``, forward, before ``t``) if
offloaded or recomputed: offloaded, its prefetch is issued before Compute of a stage at
most ``t <= b``, whose option starts at or before ``b`` (``y_u,later = 0``, and ``r_u =
0``); recomputed, its first re-make runs at or before ``t <= b`` (``w_(u,b) = 1 = r_u``);
kept, all are 0. Each case gives ``n + r_u - w_(u,b) + y_u,later <= 1``. No other row reads
``w``, and the objective does not, so the mapped point stays feasible with the same step.

Cascades
--------
A re-make reads its own inputs too: when ``v`` is re-made early, before Compute of a
stage ``b < b_v`` (a recompute due at ``b`` needs it), ``lower`` brings back, right then,
every freed input of ``v``'s producer, and recursively theirs (a cascade). The need rows
above only say that of the recompute or re-make due at ``b``, not of the inputs re-made
for it; on ResNet-50 b256 at its floor the bound LP counted a cascade through four
residual blocks (the re-made block outputs, held from ``b`` to their own backward use)
as freed. So, for every pair ``(v, b)`` of a need, and in turn of each cascade need, and
each candidate ``u`` with ``f_u < b < b_u`` that ``v``'s re-make reads, the row
``w_(v,b) - sum_(d in P) e_d + r_u - w_(u,b) + y_u,later <= 1`` (``cascade``), where
``u`` is read either by ``v``'s producer (``P`` empty) or by the maker of a freed input
``d`` of ``v`` (``DeadInput.leaves``) through the path ``P`` of freed inputs from
``v``'s producer to ``d``, each dead before the first backward stage and re-makeable
(``maker >= 0``); ``e_d`` is the bound model's column of ``d`` kept alive
(``formulation``'s ``ext``: 1 exactly when the plan does not mark ``d`` and lowering
keeps it alive for a recompute). The ``(u, b)`` pairs get ``w`` columns like any need.

Why they hold at the mapped point. If ``w_(v,b) = 0``, or some ``e_d = 1`` on ``P``, the
row is at most ``r_u - w_(u,b) + y_u,later <= 1`` (``r_u`` and ``y_u,later`` are shares of
one choice, ``w >= 0``). Else ``v``'s first re-make runs before Compute of a backward
stage ``t_v <= b`` and runs ``v``'s producer; each ``d`` on ``P`` is dead before backward
and not kept alive, so the plan marks it and lowering re-makes it before that, by running
its maker, which reads the next one on ``P``, and the last one's maker reads ``u`` (``P``
empty: ``v``'s producer reads ``u``). So ``u`` is brought back before Compute of ``t_v``
unless resident, and ``f_u < t_v <= b < b_u``: as for a need, recomputed means re-made by
``t_v <= b`` (``w_(u,b) = 1 = r_u``), offloaded means prefetched before a stage ``<= b``
(``y_u,later = 0``, ``r_u = 0``), kept means all 0; the row is ``1 + 0 <= 1`` in each case.
The memory rows of the new ``w`` columns hold as for a need (``u`` resident from its first
re-make to ``b_u``). Candidate inputs of ``v``'s producer whose gap holds ``b`` but not
``b_v`` are left out (``bound_leaves`` is taken at ``b_v``), and so are paths through freed
inputs that are still alive in backward: fewer rows, still a relaxation.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from outcore.policies.optimal.problem import Candidate, DeadInput, Problem
from outcore.policies.optimal.rows import BYTES, Rows

#: Levels of cascade rows below the needs, and the most ``w`` columns (pairs) they may
#: bring the model to (``_close_cascades``; any subset of the rows is still valid). At
#: ResNet-50 b256's floor, 4 levels take its bound LP from 0.99015 to 0.99813 s with 872
#: columns (8 or 16 levels: the same value, 2,107 or 4,022 columns); DenseNet-121 b64 at 35%
#: would reach 10,376 columns at 4 levels and twice the LP's time for the same value.
CASCADE_DEPTH = 4
CASCADE_PAIRS = 1000


@dataclass
class LeafResidency:
    """The ``w`` columns of the bound model (module doc).

    ``needs``: ``(column of the recompute or re-make, stage b, candidate u)``;
    ``cascade``: ``(v, b, u, path)``, a need of ``u`` at ``b`` by ``v``'s re-make there
    through the freed inputs ``path`` (storages; the row reads ``w_(v,b)`` where a need
    reads its column, less the kept-alive columns of ``path``); ``cols[(u, s)]``: the column of
    ``w_(u,s)``; ``stages[u]``: ``S_u``, increasing."""

    needs: list[tuple[int, int, int]] = field(default_factory=list)
    cascade: list[tuple[int, int, int, tuple[int, ...]]] = field(default_factory=list)
    cols: dict[tuple[int, int], int] = field(default_factory=dict)
    stages: dict[int, list[int]] = field(default_factory=dict)

    def add_memory(self, delta: list[dict[int, float]], problem: Problem) -> None:
        """Add each ``w_(u,s_i)``'s bytes over ``[s_i, s_(i+1))`` (the last: to ``b_u``) to
        the per-stage changes ``delta`` of the memory rows."""
        for u, ss in self.stages.items():
            c = problem.candidates[u]
            size = BYTES * c.nbytes
            for i, s in enumerate(ss):
                col = self.cols[(u, s)]
                end = ss[i + 1] if i + 1 < len(ss) else c.first_backward
                delta[s][col] = delta[s].get(col, 0.0) + size
                delta[end][col] = delta[end].get(col, 0.0) - size

    def add_rows(self, rows: Rows, recompute: list[int | None],
                 later: dict[tuple[int, int], int], kept: dict[int, int]) -> None:
        """The chain, need and cascade rows; ``later[(u, b)]`` is the column ``y_u,j`` of
        ``u``'s first prefetch option wholly after stage ``b`` (absent when there is none);
        ``kept[d]`` the column of freed input ``d`` kept alive (``formulation``'s ``ext``)."""
        for u, ss in self.stages.items():
            ru = recompute[u]
            assert ru is not None  # the bound model has r_u for every candidate
            chain = [self.cols[(u, s)] for s in ss] + [ru]
            for a, b in itertools.pairwise(chain):
                rows.add({a: 1.0, b: -1.0}, -math.inf, 0.0)
        cascade = [(self.cols[(v, b)], b, u, path) for v, b, u, path in self.cascade]
        for need, b, u, path in [*((n, b, u, ()) for n, b, u in self.needs), *cascade]:
            ru = recompute[u]
            assert ru is not None
            entries = {need: 1.0, ru: 1.0, self.cols[(u, b)]: -1.0}
            if (u, b) in later:
                entries[later[(u, b)]] = 1.0
            for d in path:
                entries[kept[d]] = -1.0
            rows.add(entries, -math.inf, 1.0)


def leaf_residency(problem: Problem, recompute: list[int | None],
                   remake: dict[tuple[int, int], tuple[int, float]],
                   first_col: int) -> LeafResidency:
    """The ``w`` columns from ``first_col`` on, for the bound model's recomputes
    (``recompute[k]``, the column ``r_k``) and re-makes (``remake[(maker op, b)]``)."""
    cands = problem.candidates
    index = {c.tensor: k for k, c in enumerate(cands)}
    out = LeafResidency()
    seen: set[tuple[int, int, int]] = set()

    def need(col: int | None, b: int, leaves: tuple[int, ...]) -> None:
        for leaf in leaves:
            u = index[leaf]
            c = cands[u]
            if col is None or not c.last_forward < b < c.first_backward:
                continue
            if (col, b, u) not in seen:
                seen.add((col, b, u))
                out.needs.append((col, b, u))

    for k, c in enumerate(cands):
        need(recompute[k], c.first_backward, c.bound_leaves)
        for d in c.dead_inputs:
            if d.maker >= 0 and (d.maker, c.first_backward) in remake:
                need(remake[(d.maker, c.first_backward)][0], c.first_backward, d.leaves)
    _close_cascades(out, problem)
    stages: dict[int, set[int]] = {}
    for b, u in [*((b, u) for _, b, u in out.needs), *((b, u) for _, b, u, _ in out.cascade)]:
        stages.setdefault(u, set()).add(b)
    col = first_col
    for u in sorted(stages):
        out.stages[u] = sorted(stages[u])
        for s in out.stages[u]:
            out.cols[(u, s)] = col
            col += 1
    return out


def _close_cascades(out: LeafResidency, problem: Problem) -> None:
    """Add ``out.cascade``: for every pair ``(v, b)`` of a need (and, in turn, of a cascade
    need), each candidate ``u`` whose gap contains ``b`` that ``v``'s re-make there reads:
    an input of ``v``'s producer (``bound_leaves``), or a leaf of a freed input ``d`` of
    ``v`` (``DeadInput.leaves``) read through the path of freed inputs from ``v``'s
    producer to ``d``, each dead before backward (module doc: cascades), up to
    ``CASCADE_DEPTH`` levels below the needs."""
    index = {c.tensor: k for k, c in enumerate(problem.candidates)}
    level = sorted({(v, b) for _, b, v in out.needs})
    seen = set(level)
    for _ in range(CASCADE_DEPTH):
        level = _cascade_level(out, problem, index, level, seen)


def _cascade_level(out: LeafResidency, problem: Problem, index: dict[int, int],
                   level: list[tuple[int, int]], seen: set[tuple[int, int]]
                   ) -> list[tuple[int, int]]:
    """One level of ``_close_cascades``: the cascade rows of the pairs ``level``, and the
    pairs they add (not in ``seen``)."""
    cands = problem.candidates
    nxt: list[tuple[int, int]] = []
    for v, b in level:
        reads: list[tuple[int, tuple[int, ...]]] = [(leaf, ()) for leaf in cands[v].bound_leaves]
        for d, path in _dead_paths(cands[v], problem.forward_stages):
            reads += [(leaf, path) for leaf in d.leaves]
        for leaf, path in reads:
            u = index[leaf]
            if not cands[u].last_forward < b < cands[u].first_backward:
                continue
            if (u, b) not in seen and len(seen) >= CASCADE_PAIRS:
                continue  # no column for w_(u,b): the row is left out
            out.cascade.append((v, b, u, path))
            if (u, b) not in seen:
                seen.add((u, b))
                nxt.append((u, b))
    return nxt


def _dead_paths(c: Candidate, forward_stages: int
                ) -> list[tuple[DeadInput, tuple[int, ...]]]:
    """Each freed input ``d`` of ``c`` that a re-make can rebuild, with the storages of the
    freed inputs from ``c``'s producer down to ``d`` (``d`` last): each read by the re-make
    of the one before (the first by ``c``'s producer) and dead before the first backward
    stage, so that a backward re-make finds it only kept alive or re-made itself."""
    made_by: dict[int, DeadInput] = {}
    for d in c.dead_inputs:
        made_by.setdefault(d.maker, d)
    out = []
    for d in c.dead_inputs:
        path: list[int] = []
        step: DeadInput | None = d
        while step is not None and step.maker >= 0 and step.last < forward_stages:
            path.append(step.storage)
            if step.needed_by < 0:
                break
            step = made_by.get(step.needed_by)
        else:
            continue  # some freed input on the way is not dead before backward
        out.append((d, tuple(reversed(path))))
    return out
