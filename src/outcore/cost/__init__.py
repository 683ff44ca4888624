"""Cost: hardware profiles (data), the analytic roofline model and measured per-op profiles.

Plain Python except ``measure_host`` and ``measure_ops``, which import torch when called.
"""

from outcore.cost.measured import MeasuredProfile, graph_digest
from outcore.cost.model import (
                                 DEFAULT_EFFICIENCY,
                                 DEFAULT_FILL_TIME,
                                 AnalyticCostModel,
                                 CostModel,
                                 VariantCosts,
)
from outcore.cost.profiles import HardwareProfile, get_profile, profile_names, profiles

__all__ = [
    "DEFAULT_EFFICIENCY",
    "DEFAULT_FILL_TIME",
    "AnalyticCostModel",
    "CostModel",
    "HardwareProfile",
    "MeasuredProfile",
    "VariantCosts",
    "get_profile",
    "graph_digest",
    "profile_names",
    "profiles",
]
