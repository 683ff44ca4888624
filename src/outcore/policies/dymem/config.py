"""Dymem's configuration."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from outcore.policies.config import PolicyConfig


@dataclass(frozen=True)
class DymemConfig(PolicyConfig):
    """``features``: the feature-map tensor ids (default: activations at their producers)."""

    doc = "outcore.policies.dymem"
    features: Sequence[int] | None = None
