"""Price operator variants from what capture recorded on each op (plain Python).

``Op.variant_options[name]`` holds the variant's workspace in bytes (exact, from the
variants' formulas) and its speed relative to the framework kernel, measured on this CPU
(``outcore.variants.speeds``). A GPU cost model multiplies its own time for the framework
kernel by that ratio: the relative cost of, say, im2col versus the direct kernel is assumed
to carry over from the CPU to the GPU (documented as an approximation in BENCHMARKS.md).
"""

from __future__ import annotations

from outcore.graph.ir import Op


class RecordedVariantCosts:
    """``VariantCosts`` read from ``op.variant_options``; unknown variants cost 1x and 0 B."""

    def time_factor(self, op: Op) -> float:
        option = op.variant_options.get(op.variant, {})
        return float(option.get("speed", 1.0))

    def workspace(self, op: Op) -> int:
        return op.variant_workspace(op.variant)


RECORDED = RecordedVariantCosts()
