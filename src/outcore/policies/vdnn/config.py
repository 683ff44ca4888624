"""vDNN's configuration and its enums (offload mode, convolution algorithms)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from outcore.policies.common.variant_spec import VariantSpec
from outcore.policies.config import PolicyConfig, check_choice


class VdnnMode(StrEnum):
    """Which feature maps vDNN offloads (Sec. III-B)."""

    NONE = "none"
    CONV = "conv"
    ALL = "all"


class VdnnAlgo(StrEnum):
    """Convolution algorithms (Sec. III-C): memory- or performance-optimal."""

    MEMORY = "m"
    PERFORMANCE = "p"


@dataclass(frozen=True)
class VdnnConfig(PolicyConfig):
    """``vdnn-dyn`` and the ``vdnn-{mode}-{algo}`` policies.

    ``variants``: op id -> variant names, or a callable graph -> that table (default: what
    capture recorded; ``outcore.policies.common.variant_spec``)."""

    doc = "outcore.policies.vdnn"
    variants: VariantSpec | None = None


@dataclass(frozen=True)
class VdnnStaticConfig(VdnnConfig):
    """``vdnn-all``, ``vdnn-conv``, ``vdnn-base``: also ``algo`` ("m" or "p", default "p")."""

    algo: VdnnAlgo = VdnnAlgo.PERFORMANCE

    def __post_init__(self) -> None:
        check_choice(self.algo, VdnnAlgo, "algo")
        object.__setattr__(self, "algo", VdnnAlgo(self.algo))
