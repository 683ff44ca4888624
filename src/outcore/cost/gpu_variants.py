"""The assumed GPU time of operator variants: the one rule every GPU cost reads (plain Python).

``gpu_time_factor(variant, kernel, stride)`` is the time of an operator variant over the time
of the framework's default kernel on a cuDNN-class GPU. Three users read it and nothing else:
``outcore.cost.variant_costs.ASSUMED_GPU`` (the GPU profiles of ``outcore.api``), the vDNN /
SuperNeurons cuDNN-4 table (``outcore.policies.vdnn.cudnn``) and moDNN's default algorithm
pricing (``outcore.policies.modnn.algos``). Rules that are not about speed stay with their
users: which algorithms cuDNN 4 could run (FFT at stride 1 only), and whether a calibrated
time is the framework kernel's or the fastest algorithm's (per-op normalisation).

Roles. For convolutions the framework kernel plays cuDNN's implicit GEMM (memory-optimal, no
workspace), "im2col" the explicit-GEMM algorithm and "fft" the FFT algorithm (see
``outcore.variants.select``). For attention the framework kernel is the fused SDPA kernel.

These are ASSUMPTIONS, not measurements (no GPU here), and none of the papers in
/work/shared/papers gives a per-algorithm time; what they do give:

* vDNN (Rhu et al., MICRO 2016), Sec. II-B and footnote 2: cuDNN 4's implicit GEMM needs no
  workspace, its FFT algorithms need workspace for the frequency-domain maps and are faster.
  Sec. V-C: the memory-optimal static policies (vDNN-all(m), vDNN-conv(m)) lose 58% and 55%
  of the oracular baseline's throughput, "an expected result" of running the slow algorithm.
  With the rule below implicit GEMM is 2.25x slower than FFT on a 3x3 stride-1 layer (a 55%
  loss on VGG-16's convolutions), so the vDNN reproduction matches that figure partly by
  construction (docs/repro/vdnn.md).
* moDNN (Chen et al., DATE 2018), Sec. IV-A/C: implicit GEMM is the zero-workspace baseline,
  "other algorithms may be faster but require some workspace"; no numbers.
* SuperNeurons (Wang et al., PPoPP 2018), Sec. 3.5: FFT in particular needs workspace "to
  deliver the maximal speed"; Fig. 12c/d: a whole step goes from 203 to 240 img/s with
  convolution workspaces, with convolutions over 50% of the step (Fig. 8). Under a 3 GB pool
  not every layer gets its fastest algorithm, so this bounds the convolution speed-up from
  below (about 1.4x or more) and is consistent with the rule, not a calibration of it.

The rule (the vDNN reproduction's, kept because it is the only one of the three former
tables that depends on the convolution's shape, the one tied to a published figure, and the
one the vDNN and moDNN reproductions already use):

* im2col: 0.85. An explicit GEMM runs closer to cuBLAS's peak than an implicit one but first
  writes the unfolded input (kh*kw times the input) to memory; both costs scale with the
  output size, so the factor depends on neither kernel nor stride.
* fft: ``clamp(4 * sh * sw / (kh * kw), 0.35, 2.0)``. A direct or GEMM convolution does kh*kw
  multiply-adds per output and its output count falls as 1/(sh*sw); an FFT convolution's cost
  is set by the padded plane, whatever the kernel and stride (outcore's FFT variant computes
  the full stride-1 correlation and samples it, ``outcore.variants.conv_fft``). FFT breaks
  even at a kernel area of 4 per output: 0.44 for a 3x3 stride-1 kernel, the 0.35 floor
  (transforms and spectra traffic are never free) for 5x5 and up, the 2.0 ceiling (never the
  fastest) for 1x1 kernels and 3x3 stride-2 ones (1.78). At stride 1 this is exactly the
  former vDNN table; cuDNN 4 ran FFT at stride 1 only, so stride matters only for outcore's
  own FFT.
* materialised 1.0, chunked 1.1: a materialised-score attention is taken as fast as the fused
  kernel, a chunked (flash-style) one pays 10% for the recomputation in its backward.

Capture evaluates the rule for each op's own kernel and stride and records it as
``Op.variant_options[variant]["gpu_speed"]`` (``gpu_time_factor_for``), which
``ASSUMED_GPU`` reads. When a caller cannot see the kernel (``kernel=None``, e.g. a
hand-made op), a 3x3 stride-1 kernel is assumed (``TYPICAL_KERNEL``), the commonest
convolution of the zoo's CNNs (all of VGG's, most of ResNet's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from outcore.variants.meta import CONV, CONV_BACKWARD, conv_meta
from outcore.variants.names import Variant

FRAMEWORK = Variant.FRAMEWORK

#: Explicit GEMM over the framework kernel (implicit GEMM).
IM2COL_FACTOR = 0.85
#: Kernel area per output at which FFT and the framework kernel take the same time.
FFT_BREAK_EVEN_AREA = 4.0
#: (floor, ceiling) of the FFT factor.
FFT_BOUNDS = (0.35, 2.0)
#: Attention variants over the fused SDPA kernel.
ATTENTION_FACTORS: Mapping[str, float] = {Variant.MATERIALISED: 1.0, Variant.CHUNKED: 1.1}
#: The kernel assumed when the caller cannot see it.
TYPICAL_KERNEL = (3, 3)

#: Every variant name ``gpu_time_factor`` prices ("" is the framework kernel too).
KNOWN_VARIANTS = frozenset({"", FRAMEWORK, Variant.IM2COL, Variant.FFT, *ATTENTION_FACTORS})


def fft_factor(kernel: tuple[int, int], stride: tuple[int, int] = (1, 1)) -> float:
    """FFT time over the framework kernel's for a ``kernel`` (kh, kw) at ``stride`` (sh, sw);
    always within ``FFT_BOUNDS``."""
    kh, kw = kernel
    sh, sw = stride
    if kh < 1 or kw < 1 or sh < 1 or sw < 1:
        raise ValueError(f"kernel {kernel} and stride {stride} must be positive integers")
    lo, hi = FFT_BOUNDS
    return min(hi, max(lo, FFT_BREAK_EVEN_AREA * sh * sw / (kh * kw)))


def gpu_time_factor(variant: str, kernel: tuple[int, int] | None = None,
                    stride: tuple[int, int] = (1, 1)) -> float:
    """Assumed GPU time of ``variant`` over the framework kernel's (the module docstring).

    ``kernel``/``stride`` matter for "fft" only; ``kernel=None`` assumes ``TYPICAL_KERNEL``
    at stride 1. The framework kernel ("" or "framework") is 1.0 by definition. Raises
    ValueError for a variant outside ``KNOWN_VARIANTS``: add its rule here, not at a caller.
    """
    if variant in ("", FRAMEWORK):
        return 1.0
    if variant == Variant.IM2COL:
        return IM2COL_FACTOR
    if variant == Variant.FFT:
        return fft_factor(kernel, stride) if kernel is not None else fft_factor(TYPICAL_KERNEL)
    if variant in ATTENTION_FACTORS:
        return ATTENTION_FACTORS[variant]
    raise ValueError(f"no assumed GPU speed for variant {variant!r}; known: "
                     f"{sorted(v for v in KNOWN_VARIANTS if v)} (add it in "
                     "outcore.cost.gpu_variants)")


def conv_gpu_time_factor(target: str, variant: str, arg_meta: Sequence[Any]) -> float:
    """``gpu_time_factor`` of a convolution (forward or backward) described by ``arg_meta``
    (see ``outcore.variants.meta``), with its own kernel and stride."""
    if target not in (CONV, CONV_BACKWARD):
        raise ValueError(f"{target} is not a convolution; call gpu_time_factor(variant) instead")
    if variant in ("", FRAMEWORK):
        return 1.0
    m = conv_meta(target, arg_meta)
    return gpu_time_factor(variant, (m.kh, m.kw), m.hw_stride)


def gpu_time_factor_for(target: str, variant: str, arg_meta: Sequence[Any]) -> float:
    """``gpu_time_factor`` of ``variant`` for an op of ``target`` with these args: a
    convolution's own kernel and stride, any other op's variant by name."""
    if target in (CONV, CONV_BACKWARD):
        return conv_gpu_time_factor(target, variant, arg_meta)
    return gpu_time_factor(variant)
