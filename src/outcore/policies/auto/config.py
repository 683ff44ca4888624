"""outcore-auto's configuration."""

from __future__ import annotations

from dataclasses import dataclass

from outcore.policies.config import PolicyConfig, check_bool


@dataclass(frozen=True)
class AutoConfig(PolicyConfig):
    """``portfolio``: also run the portfolio's candidates and keep the fastest that fits
    (default True); ``allow_variants``: let a candidate keep operator variants other than
    the framework's kernel (default False: gradients stay bit-equal to eager); ``monotone``:
    plan on a ladder of budgets so that the planned peak never rises as the budget falls
    (``outcore.policies.auto_ladder``; one plan per rung, so slower: default False);
    ``parallel``: on a large graph and two cores, run PoocH and outcore-checkpoint in a forked
    child beside outcore-optimal (``outcore.policies.auto.side``; the same plan, less wall
    time: default True; False plans in this process only)."""

    doc = "outcore.policies.auto"
    allow_variants: bool = False
    portfolio: bool = True
    monotone: bool = False
    parallel: bool = True

    def __post_init__(self) -> None:
        check_bool(self, "allow_variants", "portfolio", "monotone", "parallel")
