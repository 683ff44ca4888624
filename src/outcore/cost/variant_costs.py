"""Price operator variants: workspace from what capture recorded, time from a speed ratio.

``Op.variant_options[name]`` holds the variant's workspace in bytes (exact, from the
variants' formulas) and its speed relative to the framework kernel, measured on this CPU
(``outcore.variants.speeds``). A cost model multiplies its own time for the framework kernel
by a ratio: ``RECORDED`` uses that CPU measurement (the ``this-cpu`` profile),
``ASSUMED_GPU`` the assumed GPU ratio of ``outcore.cost.gpu_variants`` (the GPU profiles;
the single documented assumption, see that module). Plain Python.
"""

from __future__ import annotations

from outcore.cost.gpu_variants import KNOWN_VARIANTS, gpu_time_factor
from outcore.graph.ir import Op


class RecordedVariantCosts:
    """``VariantCosts`` read from ``op.variant_options``; unknown variants cost 1x and 0 B."""

    def time_factor(self, op: Op) -> float:
        option = op.variant_options.get(op.variant, {})
        return float(option.get("speed", 1.0))

    def workspace(self, op: Op) -> int:
        return op.variant_workspace(op.variant)


RECORDED = RecordedVariantCosts()


def variant_time(op: Op, seconds: float, variants: object | None) -> float:
    """``seconds`` of the framework kernel scaled to the op's chosen variant; both cost
    models price variants through here (``variants`` None means ``RECORDED``)."""
    if not op.variant:
        return seconds
    return seconds * (variants or RECORDED).time_factor(op)  # type: ignore[attr-defined]


def variant_workspace(op: Op, variants: object | None) -> int:
    """Workspace bytes of the op's chosen variant (0 for the framework kernel)."""
    if not op.variant:
        return 0
    return int((variants or RECORDED).workspace(op))  # type: ignore[attr-defined]


class AssumedGpuVariantCosts(RecordedVariantCosts):
    """Variant costs for GPU profiles: workspace as recorded (exact), time from
    ``outcore.cost.gpu_variants.gpu_time_factor`` (the one documented assumption, shared with
    the vDNN and moDNN policies) instead of this CPU's measurement.

    The factor is the one capture recorded for the op's own kernel and stride
    (``variant_options[variant]["gpu_speed"]``); an op without it (hand-made) is priced as
    the typical 3x3 stride-1 kernel (``gpu_variants.TYPICAL_KERNEL``). The framework's time
    is the calibrated analytic time (no per-op normalisation). A variant the shared rule
    does not know falls back to the recorded speed.
    """

    def time_factor(self, op: Op) -> float:
        recorded = op.variant_options.get(op.variant, {}).get("gpu_speed")
        if recorded is not None:
            return float(recorded)
        if op.variant in KNOWN_VARIANTS:
            return gpu_time_factor(op.variant)
        return super().time_factor(op)


ASSUMED_GPU = AssumedGpuVariantCosts()
