"""vDNN's configuration and its enums (offload mode, convolution algorithms)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from outcore.policies.common.variant_spec import VariantSpec
from outcore.policies.config import PolicyConfig, check_choice


class VdnnMode(StrEnum):
    """Which feature maps vDNN offloads (Sec. III-B), or ``BASE``: the paper's Torch baseline
    (Sec. IV-A: nothing offloaded, no forward map released). A member equals its string
    (``VdnnMode.ALL == "all"``), so a mode given as a string reads the same."""

    NONE = "none"
    CONV = "conv"
    ALL = "all"
    BASE = "base"


class VdnnAlgo(StrEnum):
    """Convolution algorithms (Sec. III-C): memory- or performance-optimal."""

    MEMORY = "m"
    PERFORMANCE = "p"


@dataclass(frozen=True)
class VdnnConfig(PolicyConfig):
    """``vdnn-dyn`` and the ``vdnn-{mode}-{algo}`` policies.

    ``variants``: op id -> variant names, or a callable graph -> that table (default: what
    capture recorded; False: PyTorch's kernels only, results bit-equal to eager's;
    ``outcore.policies.common.variant_spec``)."""

    doc = "outcore.policies.vdnn"
    variants: VariantSpec | None = None


@dataclass(frozen=True)
class VdnnStaticConfig(VdnnConfig):
    """``vdnn-all``, ``vdnn-conv``, ``vdnn-base``: also ``algo`` ("m" or "p", default "p";
    a ``VdnnAlgo``, or its string as ``--option algo=m`` gives it)."""

    algo: VdnnAlgo = VdnnAlgo.PERFORMANCE

    def __post_init__(self) -> None:
        check_choice(self.algo, VdnnAlgo, "algo")
        object.__setattr__(self, "algo", VdnnAlgo(self.algo))
