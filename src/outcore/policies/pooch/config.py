"""PoocH's configuration."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from outcore.errors import PolicyOptionError
from outcore.policies.config import PolicyConfig


@dataclass(frozen=True)
class PoochConfig(PolicyConfig):
    """Search limits (timeline simulations per step), re-searches against a lowered budget,
    and ``features`` (tensor ids; default: activations at their producers)."""

    doc = "outcore.policies.pooch"
    features: Sequence[int] | None = None
    step1_evaluations: int = 400
    step2_evaluations: int = 3000
    retries: int = 3

    def __post_init__(self) -> None:
        for name in ("step1_evaluations", "step2_evaluations", "retries"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise PolicyOptionError(f"options[{name!r}] must be an int >= 0, got {value!r}",
                                        "an int >= 0")
