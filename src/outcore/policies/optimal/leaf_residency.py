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
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from outcore.policies.optimal.problem import Problem
from outcore.policies.optimal.rows import BYTES, Rows


@dataclass
class LeafResidency:
    """The ``w`` columns of the bound model (module doc).

    ``needs``: ``(column of the recompute or re-make, stage b, candidate u)``;
    ``cols[(u, s)]``: the column of ``w_(u,s)``; ``stages[u]``: ``S_u``, increasing."""

    needs: list[tuple[int, int, int]] = field(default_factory=list)
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
                 later: dict[tuple[int, int], int]) -> None:
        """The chain and need rows; ``later[(u, b)]`` is the column ``y_u,j`` of ``u``'s
        first prefetch option wholly after stage ``b`` (absent when there is none)."""
        for u, ss in self.stages.items():
            ru = recompute[u]
            assert ru is not None  # the bound model has r_u for every candidate
            chain = [self.cols[(u, s)] for s in ss] + [ru]
            for a, b in itertools.pairwise(chain):
                rows.add({a: 1.0, b: -1.0}, -math.inf, 0.0)
        for need, b, u in self.needs:
            ru = recompute[u]
            assert ru is not None
            entries = {need: 1.0, ru: 1.0, self.cols[(u, b)]: -1.0}
            if (u, b) in later:
                entries[later[(u, b)]] = 1.0
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
    stages: dict[int, set[int]] = {}
    for _, b, u in out.needs:
        stages.setdefault(u, set()).add(b)
    col = first_col
    for u in sorted(stages):
        out.stages[u] = sorted(stages[u])
        for s in out.stages[u]:
            out.cols[(u, s)] = col
            col += 1
    return out
