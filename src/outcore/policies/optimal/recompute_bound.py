"""A lower bound on the step time of plans that never offload (recompute-only plans).

outcore-checkpoint's plans recompute and keep, never offload, and are lowered by
``outcore.plan.lower`` (one sub-batch, framework kernels). The portfolio skips it when no
such plan can beat the best plan it already has (``outcore.policies.auto.portfolio``).

Derivation
----------
The bound model (``formulation``, ``relaxed=True``) maps every lowered Plan to a feasible
point whose objective is at most the plan's simulated step (``formulation``'s module doc). A
plan that offloads nothing maps to a point where every offload column is 0: the prefetch
columns ``y_kj`` (``o_k = y_k0 = 0``) and the release columns ``v_ki`` (``v_ki <= o_k``).
So the bound model with those columns fixed at 0 is a relaxation of the recompute-only
plans, and its LP value is a lower bound on their simulated steps. The columns that
remain are the recomputes ``r_k``, the kept-alive and re-made inputs of recomputes, the
stage start times and the bytes freed per stage: every byte freed at a stage is a recompute
there, priced on the compute stream over the whole step, where the stage bound
(``stage_bound(..., offload=False)``) prices one stage at a time.

The model is built on the coarsest prefetch and release options (``coarsen(problem, 1,
1)``): those options only shape offload columns, all fixed at 0, so the value is the same
and the model smaller. Measured (``/work/notes/s21/lead/ronly.py``, one thread): ResNet-152
b256 in 16 GiB on v100-pcie, 2.42656 s in 0.3 s CPU on the coarse model (the same value in
1.1 s on the full one), against 2.3113 s from the recompute-only stage bound; outcore-
checkpoint's own plan there simulates at 2.705 s.
"""

from __future__ import annotations

from outcore.policies.optimal.coarse import coarsen
from outcore.policies.optimal.formulation import Model
from outcore.policies.optimal.problem import Problem

#: Relative shave of the LP's value (HiGHS's feasibility tolerance), as ``stage_bound``'s.
SLACK = 1e-6


def recompute_only_bound(problem: Problem) -> float:
    """A lower bound on the simulated step of every Plan of ``problem`` that offloads
    nothing, lowered by ``outcore.plan.lower`` (module doc); the in-core step when the
    in-core memory fits the budget or the LP has no optimum (then nothing is proven beyond
    it). Never below the in-core step."""
    in_core = problem.in_core_time
    if max(problem.memory, default=0) <= problem.budget or not problem.candidates:
        return in_core
    model = Model(coarsen(problem, 1, 1), relaxed=True)
    fixed = {col: 0.0 for k in range(len(problem.candidates))
             for col in (*model.x[k], *model.v[k])}
    sol = model.solve(integral=False, fixed=fixed)
    if not sol.optimal:
        return in_core
    return max(in_core, sol.bound * (1.0 - SLACK))
