"""outcore-auto: outcore's own greedy planner and the portfolio that runs it beside the paper
policies, keeping the fastest plan that fits.

Policies registered: ``outcore-auto`` (options: ``AutoConfig``) and ``outcore-checkpoint``
(``segments``: recompute-only checkpoint segments, one of the portfolio's candidates).
"""

from outcore.policies.auto import (  # segments registers outcore-checkpoint
    keepback,
    memo,
    policy,
    portfolio,
    release,
    segments,
    side,
)
from outcore.policies.auto.config import AutoConfig
from outcore.policies.auto.keepback import Screen, keep_back, peak_and_screen
from outcore.policies.auto.memo import memoized, plan_memo, shared_checkpoint, shared_greedy
from outcore.policies.auto.policy import HOST_COPIES_NOTE, Choice, greedy_policy, plan_auto
from outcore.policies.auto.portfolio import (
    CANDIDATES,
    LATE,
    LINEAR,
    Entry,
    PortfolioResult,
    compute_floor,
    crowned,
    run_portfolio,
)
from outcore.policies.auto.release import Released, delay_releases, released
from outcore.policies.auto.segments import find_cuts, plan_checkpoint, segment_plan
from outcore.policies.auto.side import SIDE, SideRun, can_fork

__all__ = ["CANDIDATES", "HOST_COPIES_NOTE", "LATE", "LINEAR", "SIDE", "AutoConfig", "Choice",
           "Entry", "PortfolioResult", "Released", "Screen", "SideRun", "can_fork", "compute_floor",
           "crowned", "delay_releases", "find_cuts", "greedy_policy", "keep_back", "keepback",
           "memo", "memoized", "peak_and_screen", "plan_auto", "plan_checkpoint", "plan_memo",
           "policy", "portfolio", "release", "released", "run_portfolio", "segment_plan",
           "segments", "shared_checkpoint", "shared_greedy", "side"]
