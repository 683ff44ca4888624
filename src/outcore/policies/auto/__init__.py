"""outcore-auto: outcore's own planner and the portfolio of the paper policies.

Policy registered: ``outcore-auto``.
"""

from outcore.policies.auto.policy import PORTFOLIO, Choice, plan_auto

__all__ = ["PORTFOLIO", "Choice", "plan_auto"]
