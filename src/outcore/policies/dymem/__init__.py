"""Dymem (Yang & Cheng, HPDC 2020): PoocH's classification with offload candidates and
prefetch points for nonlinear networks, and a GTBM placement of the device pool.

Policy registered: ``dymem``.
"""

from outcore.policies.dymem.config import DymemConfig
from outcore.policies.dymem.policy import (
    DEFAULT_BETA,
    PAPER,
    DymemResult,
    all_swap_minimum_for,
    place,
    plan_dymem,
)
from outcore.policies.dymem.prefetch import RECLAIMED, alg2_position, conv_positions

__all__ = [
    "DEFAULT_BETA",
    "PAPER",
    "RECLAIMED",
    "DymemConfig",
    "DymemResult",
    "alg2_position",
    "all_swap_minimum_for",
    "conv_positions",
    "place",
    "plan_dymem",
]
