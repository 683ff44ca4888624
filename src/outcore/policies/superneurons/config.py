"""SuperNeurons' configuration and its recomputation strategies."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from outcore.policies.config import PolicyConfig, check_bool, check_choice


class Recompute(StrEnum):
    """How SuperNeurons chooses what to recompute (Sec. 3.3)."""

    COST_AWARE = "cost-aware"
    SPEED = "speed"
    MEMORY = "memory"
    NONE = "none"


@dataclass(frozen=True)
class SuperNeuronsConfig(PolicyConfig):
    """``recompute`` strategy; ``offload`` CONV checkpoints through the tensor pool; ``cache``
    (the LRU tensor cache; False offloads every checkpoint as soon as it is made);
    ``variants``: op id -> supported variant names."""

    doc = "outcore.policies.superneurons"
    recompute: Recompute = Recompute.COST_AWARE
    offload: bool = True
    cache: bool = True
    variants: Mapping[int, Sequence[str]] | None = None

    def __post_init__(self) -> None:
        check_choice(self.recompute, Recompute, "recompute")
        object.__setattr__(self, "recompute", Recompute(self.recompute))
        check_bool(self, "offload", "cache")
