"""SuperNeurons' configuration and its recomputation strategies."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from outcore.policies.common.variant_spec import VariantSpec
from outcore.policies.config import PolicyConfig, check_bool, check_choice


class Recompute(StrEnum):
    """How SuperNeurons chooses what to recompute (Sec. 3.3)."""

    COST_AWARE = "cost-aware"
    SPEED = "speed"
    MEMORY = "memory"
    NONE = "none"


@dataclass(frozen=True)
class SuperNeuronsConfig(PolicyConfig):
    """``recompute`` strategy; ``offload`` CONV checkpoints through the tensor pool;
    ``tensor_cache`` (the LRU tensor cache; False offloads every checkpoint as soon as it is
    made; not ``cache``, which is ``outcore.plan``'s plan cache);
    ``variants``: op id -> variant names, or a callable graph -> that table
    (``outcore.policies.common.variant_spec``); False: PyTorch's kernels only, results
    bit-equal to eager's."""

    doc = "outcore.policies.superneurons"
    recompute: Recompute = Recompute.COST_AWARE
    offload: bool = True
    tensor_cache: bool = True
    variants: VariantSpec | None = None

    def __post_init__(self) -> None:
        check_choice(self.recompute, Recompute, "recompute")
        object.__setattr__(self, "recompute", Recompute(self.recompute))
        check_bool(self, "offload", "tensor_cache")
