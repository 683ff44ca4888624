"""What each convolution variant can compute, declared once (plain Python, no torch).

A variant is offered for an op only where its declaration covers the op: the support checks
(``support.conv_refusal``, read by capture, which records the refusal in
``Op.variant_options``, and by ``registry.supported_variants`` for shape-only pricing) are
derived from these declarations, and every search (moDNN's eq. (5), SuperNeurons' fastest
fit, vDNN's settings) draws its candidates from what those checks let through. The
implementations re-check the layout conditions on the real tensors at run time.

Each declaration also states the variant's accuracy against the framework kernel
(``tolerance``): the largest ``max|variant - framework|`` over ``max|framework|`` that its
summation order may produce, per dtype. The conformance table in
``tests/variants/test_conv_capability.py`` holds every variant to it on every configuration
the declaration covers, and checks that the declaration refuses the rest.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from outcore.variants.meta import ConvMeta, TensorMeta
from outcore.variants.names import Variant

#: The one memory format the variants read and write: dense row-major (torch.contiguous_format).
CONTIGUOUS = "contiguous"


@dataclass(frozen=True)
class ConvCapability:
    """The convolutions a variant computes.

    Attributes:
        spatial_dims: dimensionalities it computes (1 for Conv1d, 2 for Conv2d, ...).
        grouped: whether groups > 1 (grouped and depthwise convolutions) are computed.
        dilated: whether a dilation other than 1 is computed.
        strided: whether a stride other than 1 is computed.
        padded: whether (symmetric, zero) padding other than 0 is computed.
        transposed: whether transposed convolutions are computed.
        dtypes: the floating dtypes it computes (every tensor argument shares one).
        memory_formats: the layouts of its tensor arguments it reads (``CONTIGUOUS``).
        tolerance: dtype -> the error bound stated above.
    """

    spatial_dims: frozenset[int]
    grouped: bool
    dilated: bool
    strided: bool
    padded: bool
    transposed: bool
    dtypes: frozenset[str]
    memory_formats: frozenset[str]
    tolerance: Mapping[str, float]

    def refusal(self, m: ConvMeta, grad_output: TensorMeta | None = None) -> str | None:
        """The reason this variant cannot compute ``m`` (None when it can)."""
        if m.spatial_dims not in self.spatial_dims:
            return (f"{m.spatial_dims}-d convolutions are not implemented (only "
                    f"{_dims(self.spatial_dims)})")
        if not m.transposed and (m.groups < 1 or m.o % m.groups != 0
                                 or m.weight.shape[1] * m.groups != m.c):
            return (f"weight {m.weight.shape} does not fit {m.c} input channels with "
                    f"groups={m.groups} (the framework kernel refuses it too)")
        if m.transposed and not self.transposed:
            return "transposed convolutions are not implemented"
        if m.groups != 1 and not self.grouped:
            return f"grouped convolution (groups={m.groups}) is not implemented"
        if any(d != 1 for d in m.dilation) and not self.dilated:
            return f"dilation {m.dilation} is not implemented"
        if any(s != 1 for s in m.stride) and not self.strided:
            return f"stride {m.stride} is not implemented"
        if any(p != 0 for p in m.padding) and not self.padded:
            return f"padding {m.padding} is not implemented"
        if any(s <= 0 for s in m.out_spatial):
            return f"the output would be empty ({m.out_spatial})"
        return self._tensor_refusal(m, grad_output)

    def _tensor_refusal(self, m: ConvMeta, grad_output: TensorMeta | None) -> str | None:
        tensors = [("input", m.input), ("weight", m.weight)]
        if m.bias is not None:
            tensors.append(("bias", m.bias))
        if grad_output is not None:
            tensors.append(("grad_output", grad_output))
        for name, t in tensors:
            if t.dtype not in self.dtypes:
                return f"{name} dtype {t.dtype} is not one of {sorted(self.dtypes)}"
            if t.dtype != m.input.dtype:
                return f"{name} dtype {t.dtype} differs from the input's {m.input.dtype}"
            layout = memory_format(t)
            if layout not in self.memory_formats:
                return (f"{name} has strides {t.stride} ({layout}); only "
                        f"{sorted(self.memory_formats)} tensors are read")
        return None


def _dims(dims: frozenset[int]) -> str:
    return ", ".join(f"{d}-d" for d in sorted(dims))


def _dense(shape: tuple[int, ...], stride: tuple[int, ...], order: list[int]) -> bool:
    """Whether ``stride`` is that of a dense tensor whose dims, innermost last, are ``order``."""
    acc = 1
    for d in reversed(order):
        if shape[d] != 1 and stride[d] != acc:
            return False
        acc *= shape[d]
    return True


def memory_format(t: TensorMeta) -> str:
    """``CONTIGUOUS`` when ``t`` is dense row-major (or its strides are unknown);
    "channels_last" for a dense (N, *spatial, C) layout of a 4-d or 5-d tensor; else
    "strided" (a transposed view, an expanded tensor, a slice, ...)."""
    if t.stride is None or _dense(t.shape, t.stride, list(range(len(t.shape)))):
        return CONTIGUOUS
    rank = len(t.shape)
    if rank in (4, 5) and _dense(t.shape, t.stride, [0, *range(2, rank), 1]):
        return "channels_last"
    return "strided"


_FLOATS = frozenset({"float32", "float64"})

#: im2col + GEMM: any dimensionality up to 3, stride, padding, dilation and groups.
IM2COL = ConvCapability(
    spatial_dims=frozenset({1, 2, 3}), grouped=True, dilated=True, strided=True, padded=True,
    transposed=False, dtypes=_FLOATS, memory_formats=frozenset({CONTIGUOUS}),
    tolerance={"float32": 1e-5, "float64": 2e-14})

#: FFT: 2-d, dense (undilated) kernels, one group; any stride (sampled) and padding.
FFT = ConvCapability(
    spatial_dims=frozenset({2}), grouped=False, dilated=False, strided=True, padded=True,
    transposed=False, dtypes=_FLOATS, memory_formats=frozenset({CONTIGUOUS}),
    tolerance={"float32": 3e-5, "float64": 5e-14})

#: Variant name -> declaration, for the convolution forward and backward ops.
CONV_CAPABILITIES: Mapping[str, ConvCapability] = {Variant.IM2COL: IM2COL, Variant.FFT: FFT}
