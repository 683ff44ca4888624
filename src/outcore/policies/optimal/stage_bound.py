"""A cheap, honest lower bound on the step time from single stages (the stage bound).

The full bound model (``formulation``, ``relaxed=True``) couples every stage and every
candidate; its LP does not solve in seconds on 10^4 layers. This bound looks at one stage at
a time: a small LP over the candidates that cover it, so it scales to SuperNeurons'
2,500-unit ResNet. It is weaker than the full LP where copies can hide behind compute, and
useful where the budget forces more traffic or recompute than the step can hide (ResNet-152
b256 in 16 GiB on PCIe).

Derivation
----------
Notation as in ``problem``: stages ``s`` in lowering order with times ``c_s``,
``T = sum_s c_s``; ``M_t`` the in-core bytes at the Compute sample of stage ``t``; budget
``B``; candidate ``k`` of ``nbytes`` ``s_k``, gap ``(f_k, b_k)``, copy times ``d_k``
(D2H) and ``h_k`` (H2D), and ``R_k = recompute_floor`` (its producer's time shared among the
producer's movable outputs).

Take any Plan lowered by ``outcore.plan.lower`` that fits ``B`` (framework kernels, one
sub-batch) and any stage ``t`` with ``X_t = M_t - B > 0``. Outside its gap a candidate is
resident at every Compute sample, every other tensor is resident at least as long as in
core (``problem``'s doc), so the candidates not resident at ``t``'s sample cover ``t``
(``f_k < t < b_k``) and hold at least ``X_t`` bytes. Each is offloaded (``o_k = 1``) or
recomputed (``r_k = 1``):

* recomputed: its producer runs again after ``t`` (it is absent at ``t``'s sample and needed
  at ``b_k > t``) on the one compute stream; the shares ``R_k`` of one producer add up to at
  most its time, so the compute stream after ``t`` runs at least
  ``C_t + sum_k R_k r_k`` with ``C_t = sum_{s > t} c_s``;
* offloaded: its Free is on the compute stream after the Wait for its D2H copy and before
  Compute of ``t``, so Compute of ``t`` starts after every such copy ended; copies of one
  direction run one at a time, from time 0 at the earliest: ``start_t >= sum_k d_k o_k``,
  and ``start_t >= F_t = sum_{s < t} c_s``. Its prefetch is issued after Compute of ``t``
  (an issued prefetch is resident) and waited for before Compute of ``b_k``, so the H2D
  copies run after ``start_t + c_t``, one at a time, and the step ends after them.

Hence ``step >= max(F_t, V) + c_t + max(C_t + R, W)`` with ``V = sum d_k o_k``,
``W = sum h_k o_k``, ``R = sum R_k r_k``; i.e. ``step >= T + R + u + w`` with
``u = max(0, V - F_t)`` and ``w = max(0, W - C_t - R)``. Minimising ``R + u + w`` over
fractional ``0 <= o_k, r_k``, ``o_k + r_k <= 1``, ``sum s_k (o_k + r_k) >= X_t`` relaxes
the integral choice, so ``T + LP_t`` is a lower bound for every stage ``t``, and so is the
largest over any set of stages. The bound evaluates the ``STAGES`` stages of largest
excess (ties: the earlier stage), never less than ``T`` (the in-core step).

What it leaves out (so it stays a relaxation): copies overlapping each other across
directions on a shared engine, prefetch windows, memory at other stages, recompute chains'
extra producers. The LP's value is shaved by ``SLACK`` (relative) for the solver's
tolerance.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linprog  # type: ignore[import-untyped]
from scipy.sparse import coo_matrix  # type: ignore[import-untyped]

from outcore.policies.optimal.problem import Problem

#: Stages of largest excess whose LP is solved (any subset gives a valid bound).
STAGES = 8
#: Relative shave of the LP's value (HiGHS's feasibility tolerance).
SLACK = 1e-6
#: The LP works in GiB and milliseconds (coefficients near 1).
_GIB = 2.0**-30
_MS = 1e3


def stage_bound(problem: Problem, stages: int = STAGES, *, offload: bool = True) -> float:
    """``T + max_t LP_t`` over the ``stages`` stages of largest excess (module doc); ``T``
    when the in-core memory fits the budget. ``offload=False``: the bound of plans that
    never offload (recompute-only, as outcore-checkpoint's): every ``o_k`` is 0, so each
    ``LP_t`` is the least recompute time that frees ``X_t`` bytes at ``t`` (the same
    derivation with no offloaded candidate), a bound on those plans only."""
    times = np.asarray(problem.op_time, dtype=float)
    total = float(times.sum())
    excess = np.asarray(problem.memory, dtype=float) - problem.budget
    over = [int(t) for t in np.flatnonzero(excess > 0)]
    if not over:
        return total
    picked = sorted(over, key=lambda t: (-excess[t], t))[:stages]
    before = np.concatenate(([0.0], np.cumsum(times)))
    best = 0.0
    for t in sorted(picked):
        best = max(best, _stage_lp(problem, t, float(excess[t]), float(before[t]),
                                   float(total - before[t + 1]), offload))
    return total + best


def _stage_lp(problem: Problem, t: int, need: float, forward: float, after: float,
              offload: bool = True) -> float:
    """The least ``R + u + w`` (seconds) that frees ``need`` bytes at stage ``t`` (every
    ``o_k`` 0 when not ``offload``: any candidate can be recomputed, by a chain of any depth,
    at ``R_k`` or more)."""
    cover = [c for c in problem.candidates if c.last_forward < t < c.first_backward]
    if sum(c.nbytes for c in cover) < need:  # no plan frees enough here: nothing to say
        return 0.0
    n = len(cover)
    # columns: o_0..o_{n-1}, r_0..r_{n-1}, u, w
    u, w = 2 * n, 2 * n + 1
    cost = np.zeros(2 * n + 2)
    cost[n:2 * n] = [c.recompute_floor * _MS for c in cover]
    cost[u] = cost[w] = 1.0
    rows, cols, vals = [], [], []
    hi: list[float] = []

    def entry(row: int, col: int, val: float) -> None:
        rows.append(row)
        cols.append(col)
        vals.append(val)

    for k in range(n):  # o_k + r_k <= 1
        entry(k, k, 1.0)
        entry(k, n + k, 1.0)
        hi.append(1.0)
    row = n  # -(sum s_k (o_k + r_k)) <= -need
    for k, c in enumerate(cover):
        entry(row, k, -c.nbytes * _GIB)
        entry(row, n + k, -c.nbytes * _GIB)
    hi.append(-need * _GIB)
    row += 1  # sum d_k o_k - u <= F_t
    for k, c in enumerate(cover):
        entry(row, k, c.d2h * _MS)
    entry(row, u, -1.0)
    hi.append(forward * _MS)
    row += 1  # sum h_k o_k - sum R_k r_k - w <= C_t
    for k, c in enumerate(cover):
        entry(row, k, c.h2d * _MS)
        entry(row, n + k, -c.recompute_floor * _MS)
    entry(row, w, -1.0)
    hi.append(after * _MS)
    matrix = coo_matrix((vals, (rows, cols)), shape=(row + 1, 2 * n + 2)).tocsr()
    bounds = [(0.0, 1.0 if offload else 0.0)] * n + [(0.0, 1.0)] * n + [(0.0, None), (0.0, None)]
    res = linprog(cost, A_ub=matrix, b_ub=np.asarray(hi), bounds=bounds, method="highs")
    if res.status != 0 or res.fun is None:
        return 0.0  # no proof from this stage (the in-core step stands)
    return max(0.0, float(res.fun) / _MS * (1.0 - SLACK))
