"""What the paper policies share: layer structure, operator-variant pricing, and the profiled
timeline (PoocH's, which Dymem borrows)."""

from outcore.policies.common.costs import bound
from outcore.policies.common.layers import (
    INPLACE_ACTIVATIONS,
    fuses_into_activation,
    through_activations,
)
from outcore.policies.common.timeline import (
    KEEP,
    RECOMPUTE,
    SWAP,
    Evaluation,
    Profile,
    SwapInRule,
    earliest_fit,
    evaluate,
    producer,
)
from outcore.policies.common.variants import FRAMEWORK, Variants, candidates

__all__ = [
    "FRAMEWORK", "INPLACE_ACTIVATIONS", "KEEP", "RECOMPUTE", "SWAP", "Evaluation", "Profile",
    "SwapInRule", "Variants", "bound", "candidates", "earliest_fit", "evaluate",
    "fuses_into_activation", "producer", "through_activations",
]
