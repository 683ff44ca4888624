"""outcore-optimal: the joint keep / offload / recompute model on HiGHS, with a proven lower
bound on the step time (see ``formulation`` for the derivation, ``planner`` for the loop)."""

from outcore.policies.optimal.planner import NAME, OptimalResult, plan_optimal

__all__ = ["NAME", "OptimalResult", "plan_optimal"]
