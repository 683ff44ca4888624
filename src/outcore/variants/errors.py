"""The error a variant raises when asked for an op it cannot run (plain Python)."""

from __future__ import annotations

from outcore.errors import OutcoreError


class VariantUnsupported(OutcoreError):
    """A variant cannot run this op (groups, dilation, dtype, dropout, ...).

    Raised at planning time by ``check_supported`` so that a plan never names a variant that
    would fail or silently compute something else at run time.

    Attributes:
        target: the ATen op, e.g. "aten.convolution.default".
        variant: the variant asked for, e.g. "fft".
        reason: why it cannot run, in words.
    """

    def __init__(self, target: str, variant: str, reason: str) -> None:
        self.target = target
        self.variant = variant
        self.reason = reason
        super().__init__(
            f"variant {variant!r} cannot run {target}: {reason}. "
            f"Use variant 'framework' for this op (always supported), or change the layer."
        )
