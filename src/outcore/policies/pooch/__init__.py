"""PoocH (Imai et al., 2019): profile the step, classify each feature map keep / swap /
recompute (``FeatureClass``, a str enum shared with Dymem through ``policies.common``), and
schedule swaps just in time.

Policy registered: ``pooch``.
"""

from outcore.policies.common.timeline import FeatureClass
from outcore.policies.pooch.classify import Classification, all_swap_minimum, classify, just_in_time
from outcore.policies.pooch.config import PoochConfig
from outcore.policies.pooch.policy import PAPER, PoochResult, plan_pooch
from outcore.policies.pooch.schedule import build_schedule

__all__ = [
    "PAPER",
    "Classification",
    "FeatureClass",
    "PoochConfig",
    "PoochResult",
    "all_swap_minimum",
    "build_schedule",
    "classify",
    "just_in_time",
    "plan_pooch",
]
