"""What the paper policies share: layer structure, operator-variant pricing, the context's
budget and cost model, and the profiled timeline (PoocH's, which Dymem borrows)."""

from outcore.policies.common.context import budget_of, cost_of
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
    FeatureClass,
    ForwardPrefixes,
    Profile,
    SwapInRule,
    earliest_fit,
    evaluate,
    producer,
    span_sum,
)
from outcore.policies.common.variant_spec import VariantSpec, variant_table
from outcore.policies.common.variants import FRAMEWORK, Variants, candidates

__all__ = [
    "FRAMEWORK", "INPLACE_ACTIVATIONS", "KEEP", "RECOMPUTE", "SWAP", "Evaluation",
    "FeatureClass", "ForwardPrefixes", "Profile", "SwapInRule", "VariantSpec", "Variants",
    "bound", "budget_of", "candidates", "cost_of", "earliest_fit", "evaluate",
    "fuses_into_activation", "producer", "span_sum", "through_activations", "variant_table",
]
