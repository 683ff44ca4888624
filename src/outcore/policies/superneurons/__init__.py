"""SuperNeurons (Wang et al., PPoPP 2018): liveness, cost-aware recomputation between
checkpoint layers, and the Unified Tensor Pool (offload with an LRU tensor cache).

Policy registered: ``superneurons``.
"""

from outcore.policies.superneurons.config import Recompute, SuperNeuronsConfig
from outcore.policies.superneurons.policy import (
    NAME,
    PAPER,
    SuperNeuronsResult,
    least_budget,
    plan_superneurons,
)
from outcore.policies.superneurons.segments import (
    STRATEGIES,
    Segment,
    Segmentation,
    checkpoint_tensor,
    segment,
)
from outcore.policies.superneurons.utp import LruCache, UtpStats, first_reads_in

__all__ = [
    "NAME",
    "PAPER",
    "STRATEGIES",
    "LruCache",
    "Recompute",
    "Segment",
    "Segmentation",
    "SuperNeuronsConfig",
    "SuperNeuronsResult",
    "UtpStats",
    "checkpoint_tensor",
    "first_reads_in",
    "least_budget",
    "plan_superneurons",
    "segment",
]
