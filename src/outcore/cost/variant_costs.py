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


#: Time of a variant relative to the framework kernel on a cuDNN-class GPU, where outcore's
#: "framework" kernel stands for the memory-optimal, zero-workspace algorithm (cuDNN's
#: implicit GEMM) and the variants for the faster algorithms that need workspace. These are
#: ASSUMPTIONS, not measurements (no GPU here): vDNN (MICRO 2016, §V) reports memory-optimal
#: policies losing 55-58% of throughput against performance-optimal algorithms (offload
#: stalls included); the cuDNN paper (Chetlur et al. 2014) and Lavin & Gray (CVPR 2016)
#: report precomputed-GEMM and FFT/Winograd kernels well ahead of implicit GEMM on 3x3
#: layers. Attention: chunked (flash-style) kernels are about as fast as materialised ones
#: on GPUs; we charge them 1.1x for the recomputation in backward.
GPU_RELATIVE_SPEED = {"im2col": 0.8, "fft": 0.6, "materialised": 1.0, "chunked": 1.1}


class AssumedGpuVariantCosts(RecordedVariantCosts):
    """Variant costs for GPU profiles: workspace as recorded (exact), time from
    ``GPU_RELATIVE_SPEED`` (an assumption, see above) instead of this CPU's measurement."""

    def time_factor(self, op: Op) -> float:
        if op.variant in GPU_RELATIVE_SPEED:
            return GPU_RELATIVE_SPEED[op.variant]
        return super().time_factor(op)


ASSUMED_GPU = AssumedGpuVariantCosts()
