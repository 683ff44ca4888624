"""outcore-optimal: the joint keep / offload / recompute model on HiGHS, with a proven lower
bound on the step time (see ``formulation`` for the derivation, ``planner`` for the loop)."""

from outcore.policies.optimal import (
    coarse,
    formulation,
    leaf_residency,
    planner,
    policy,
    polish,
    recompute_bound,
    rounding,
)
from outcore.policies.optimal.coarse import coarsen
from outcore.policies.optimal.planner import NAME, OptimalResult, plan_optimal
from outcore.policies.optimal.policy import floor, lower_bound
from outcore.policies.optimal.problem import Candidate, Problem, build_problem, stage_order
from outcore.policies.optimal.quiet import highs_quiet
from outcore.policies.optimal.recompute_bound import recompute_only_bound
from outcore.policies.optimal.stage_bound import stage_bound

__all__ = ["NAME", "Candidate", "OptimalResult", "Problem", "build_problem", "coarse", "coarsen",
           "floor", "formulation", "highs_quiet", "leaf_residency", "lower_bound", "plan_optimal",
           "planner", "policy", "polish", "recompute_bound",
           "recompute_only_bound", "rounding", "stage_bound", "stage_order"]
