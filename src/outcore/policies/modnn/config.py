"""moDNN's configuration."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from outcore.policies.config import PolicyConfig

VariantSpec = Mapping[int, Sequence[str]] | Callable[[Any], Mapping[int, Sequence[str]]]


@dataclass(frozen=True)
class ModnnConfig(PolicyConfig):
    """``batch_size`` (else read from the inputs' first dimension); ``variants`` (op id ->
    variant names, or a callable graph -> that table; default: every variant outcore has)."""

    doc = "outcore.policies.modnn"
    batch_size: int | None = None
    variants: VariantSpec | None = None

    def __post_init__(self) -> None:
        if self.batch_size is not None and (not isinstance(self.batch_size, int)
                                            or self.batch_size < 1):
            raise ValueError(f"options['batch_size'] must be a positive int, got "
                             f"{self.batch_size!r}")
