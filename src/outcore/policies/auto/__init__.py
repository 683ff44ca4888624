"""outcore-auto: outcore's own greedy planner and the portfolio that runs it beside the paper
policies, keeping the fastest plan that fits.

Policies registered: ``outcore-auto`` (options: ``AutoConfig``) and ``outcore-checkpoint``
(``segments``: recompute-only checkpoint segments, one of the portfolio's candidates).
"""

from outcore.policies.auto import segments  # registers outcore-checkpoint
from outcore.policies.auto.config import AutoConfig
from outcore.policies.auto.policy import Choice, greedy_policy, plan_auto
from outcore.policies.auto.portfolio import (
    CANDIDATES,
    Entry,
    PortfolioResult,
    crowned,
    run_portfolio,
)

__all__ = ["CANDIDATES", "AutoConfig", "Choice", "Entry", "PortfolioResult", "crowned",
           "greedy_policy", "plan_auto", "run_portfolio", "segments"]
