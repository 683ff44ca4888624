"""Convolution algorithms on a paper-era GPU, for reproducing vDNN and SuperNeurons (plain Python).

vDNN (Sec. II-B, footnote 2) and SuperNeurons (Sec. 3.5) choose among cuDNN's convolution
algorithms: implicit GEMM needs no workspace and is the slowest; the GEMM and FFT algorithms
need workspace and are faster. outcore's variants play those roles (see
``outcore.variants.select``): "framework" (zero workspace) is implicit GEMM, "im2col" is the
explicit-GEMM algorithm, "fft" is the FFT algorithm. Their workspace comes from
``outcore.variants.registry`` (exact for outcore's implementations).

Their speed on the paper's GPU is not something outcore can measure: it is the assumption
shared by every GPU cost, ``outcore.cost.gpu_variants.conv_gpu_time_factor`` (im2col 0.85,
FFT ``clamp(4 * sh * sw / (kh * kw), 0.35, 2.0)``: 0.44 for 3x3, 0.35 for 5x5 and up, 2.0 for
1x1; that module cites where the numbers come from). What stays here is cuDNN 4's
*availability* rule: its FFT algorithms ran stride-1 convolutions only (``_cudnn_allows``).

With that rule, implicit GEMM is about 2.2x slower than the fastest algorithm on VGG-16's 3x3
layers, which is what vDNN's Sec. V-C reports for its memory-optimal static policies (55-58%
performance loss, most of it from the algorithm). The analytic cost model was calibrated on
Torch + cuDNN 4 timings that used the fastest algorithm per layer, so ``time_factor`` is
normalised per op: the fastest supported variant gets 1.0 (the calibrated time), the others
their ratio to it. An op without ``op.variant`` is priced at 1.0, as calibrated.

``CudnnAlgorithms`` implements ``outcore.cost.model.VariantCosts`` (give it to
``AnalyticCostModel(profile, variants=...)``) and ``supported()`` gives the table the vDNN and
SuperNeurons policies read from ``ctx.options["variants"]``. It needs each convolution's
``arg_meta`` (see ``outcore.variants.meta``), which the caller extracts from the captured FX
graph (``outcore.variants.torchmeta.arg_meta_of(node.args)``): the planner side never imports
torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from outcore.cost.gpu_variants import conv_gpu_time_factor
from outcore.graph.ir import Graph, Op
from outcore.variants import registry
from outcore.variants.meta import CONV, CONV_BACKWARD, conv_meta
from outcore.variants.names import Variant

#: The op targets this model prices (forward and backward convolution).
TARGETS = (CONV, CONV_BACKWARD)


def relative_time(target: str, variant: str, arg_meta: Sequence[Any]) -> float:
    """Time of ``variant`` relative to implicit GEMM on this convolution: the shared GPU rule
    (``outcore.cost.gpu_variants``); availability is ``_cudnn_allows``'s business."""
    return conv_gpu_time_factor(target, variant, arg_meta)


def _cudnn_allows(target: str, variant: str, arg_meta: Sequence[Any]) -> bool:
    """cuDNN 4's FFT algorithms ran stride-1 convolutions only."""
    return variant != Variant.FFT or conv_meta(target, arg_meta).stride == (1, 1)


class CudnnAlgorithms:
    """Workspace and relative speed of convolution variants on a cuDNN-4-era GPU.

    Args:
        targets: op id -> ATen target of every op ``arg_meta`` describes.
        arg_meta: op id -> the op's ``arg_meta``. Ops whose target is not a convolution are
            ignored.

    Invariant: for every described op, ``supported()[op]`` starts with "framework" and
    ``time_factor`` is 1.0 on its fastest supported variant and >= 1.0 on the others.
    """

    def __init__(self, targets: Mapping[int, str], arg_meta: Mapping[int, Sequence[Any]]) -> None:
        self._meta: dict[int, tuple[str, Sequence[Any]]] = {}
        self._workspace: dict[int, dict[str, int]] = {}
        self._factor: dict[int, dict[str, float]] = {}
        for op_id, meta in arg_meta.items():
            target = targets[op_id]
            if target not in TARGETS:
                continue
            usable = {v: w for v, w in registry.supported_variants(target, meta).items()
                      if _cudnn_allows(target, v, meta)}
            rel = {v: relative_time(target, v, meta) for v in usable}
            fastest = min(rel.values())
            self._meta[op_id] = (target, meta)
            self._workspace[op_id] = usable
            self._factor[op_id] = {v: r / fastest for v, r in rel.items()}

    @classmethod
    def for_graph(cls, graph: Graph, arg_meta: Mapping[int, Sequence[Any]]) -> CudnnAlgorithms:
        """The model for ``graph``'s convolutions; ``arg_meta`` may list any of its ops."""
        return cls({op.id: op.target for op in graph.ops}, arg_meta)

    def supported(self) -> dict[int, list[str]]:
        """op id -> variant names cuDNN could run it with ("framework" first)."""
        return {op: list(ws) for op, ws in self._workspace.items()}

    # -- VariantCosts ------------------------------------------------------------------------
    def time_factor(self, op: Op) -> float:
        """Time of ``op.variant`` over the fastest supported variant's (1.0 when unknown)."""
        return self._factor.get(op.id, {}).get(op.variant, 1.0)

    def workspace(self, op: Op) -> int:
        """Workspace bytes of ``op.variant`` (0 for the framework kernel or an unknown op)."""
        table = self._workspace.get(op.id)
        if table is None or op.variant not in table:
            return 0
        return table[op.variant]
