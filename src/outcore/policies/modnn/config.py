"""moDNN's configuration."""

from __future__ import annotations

from dataclasses import dataclass

from outcore.errors import PolicyOptionError
from outcore.policies.common.variant_spec import VariantSpec
from outcore.policies.config import PolicyConfig

__all__ = ["ModnnConfig", "VariantSpec"]


@dataclass(frozen=True)
class ModnnConfig(PolicyConfig):
    """``batch_size`` and ``batch_dims`` (each input's batch dimension; else inferred from
    the inputs' shapes, ``outcore.graph.batch_dims``); ``sub_batch_statistics`` (split a
    model whose ops compute statistics over the batch, e.g. BatchNorm: default False);
    ``variants`` (op id -> variant names, or a callable graph -> that table; default: every
    variant outcore has; False: PyTorch's kernels only, results bit-equal to eager's)."""

    doc = "outcore.policies.modnn"
    batch_size: int | None = None
    batch_dims: tuple[int, ...] | None = None
    sub_batch_statistics: bool = False
    variants: VariantSpec | None = None

    def batch_options(self) -> dict[str, object]:
        """``batch_size``/``batch_dims`` as ``outcore.graph.batch_dims.graph_batch`` reads them."""
        return {k: v for k, v in (("batch_size", self.batch_size),
                                  ("batch_dims", self.batch_dims)) if v is not None}

    def __post_init__(self) -> None:
        if self.batch_size is not None and (not isinstance(self.batch_size, int)
                                            or self.batch_size < 1):
            raise PolicyOptionError(f"options['batch_size'] must be a positive int, got "
                                    f"{self.batch_size!r}", "a positive int")
