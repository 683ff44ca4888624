"""Plain-data views of an op's arguments (no torch import).

The planner describes a node's arguments as ``arg_meta``: the node's positional args with
every tensor replaced by a ``(shape, dtype_str)`` tuple (optionally ``(shape, dtype_str,
stride)``), and ``None`` / ints / lists / bools left as they are; keyword arguments likewise
as ``kwarg_meta``. This module parses those into small frozen dataclasses that the workspace
formulas and the support checks read. Dtype strings may be "float32" or "torch.float32".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from outcore.graph.dtypes import itemsize

CONV = "aten.convolution.default"
CONV_BACKWARD = "aten.convolution_backward.default"
SDPA = "aten._scaled_dot_product_flash_attention_for_cpu.default"
SDPA_BACKWARD = "aten._scaled_dot_product_flash_attention_for_cpu_backward.default"


def dtype_name(dtype: str) -> str:
    """Normalise "torch.float32" to "float32"."""
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class TensorMeta:
    """Shape, dtype and (if known) strides of one tensor argument."""

    shape: tuple[int, ...]
    dtype: str
    stride: tuple[int, ...] | None = None

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= int(s)
        return n

    @property
    def itemsize(self) -> int:
        return itemsize(self.dtype)


def tensor_meta(value: Any) -> TensorMeta | None:
    """Parse a ``(shape, dtype[, stride])`` tuple; None stays None."""
    if value is None:
        return None
    if isinstance(value, TensorMeta):
        return value
    if not isinstance(value, (tuple, list)) or len(value) not in (2, 3):
        raise ValueError(f"expected (shape, dtype_str[, stride]) for a tensor, got {value!r}")
    shape = tuple(int(s) for s in value[0])
    stride = tuple(int(s) for s in value[2]) if len(value) == 3 and value[2] is not None else None
    return TensorMeta(shape, dtype_name(value[1]), stride)


def _spatial(value: Any, dims: int) -> tuple[int, ...]:
    """One int per spatial dimension from an ATen int list (a single value is repeated)."""
    seq = [int(v) for v in (value if isinstance(value, Sequence) else [value])]
    if len(seq) == 1 and dims != 1:
        seq = seq * dims
    return tuple(seq)


@dataclass(frozen=True)
class ConvMeta:
    """The arguments of a convolution of any dimensionality, forward or backward, as numbers.

    ``stride``, ``padding``, ``dilation``: one entry per spatial dimension
    (``spatial_dims`` = input rank - 2). ``spatial``, ``kernel``, ``out_spatial``: the
    input's, weight's and output's spatial sizes (the output from the convolution
    arithmetic, for non-transposed convolutions). The 2-d names ``h, w, kh, kw, ho, wo`` read
    the first two spatial dimensions (a 1-d convolution has ``w = kw = wo = 1``); they exist
    for the 2-d FFT variant and the GPU speed rule.
    """

    input: TensorMeta
    weight: TensorMeta
    bias: TensorMeta | None
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    transposed: bool
    groups: int
    spatial_dims: int
    output_mask: tuple[bool, bool, bool] = (True, True, True)
    bias_sizes: tuple[int, ...] | None = None

    @property
    def dtype(self) -> str:
        return self.input.dtype

    @property
    def itemsize(self) -> int:
        return self.input.itemsize

    @property
    def n(self) -> int:
        return self.input.shape[0]

    @property
    def c(self) -> int:
        return self.input.shape[1]

    @property
    def o(self) -> int:
        return self.weight.shape[0]

    @property
    def spatial(self) -> tuple[int, ...]:
        return tuple(self.input.shape[2:])

    @property
    def kernel(self) -> tuple[int, ...]:
        return tuple(self.weight.shape[2:])

    @property
    def out_spatial(self) -> tuple[int, ...]:
        """Output size per spatial dimension: (size + 2 pad - dilation (k - 1) - 1) // stride
        + 1 (may be <= 0 for an input smaller than the kernel's span)."""
        return tuple((size + 2 * pad - dil * (k - 1) - 1) // st + 1
                     for size, k, st, pad, dil in zip(self.spatial, self.kernel, self.stride,
                                                      self.padding, self.dilation, strict=False))

    def _dim(self, sizes: tuple[int, ...], i: int) -> int:
        return sizes[i] if i < len(sizes) else 1

    @property
    def h(self) -> int:
        return self._dim(self.spatial, 0)

    @property
    def w(self) -> int:
        return self._dim(self.spatial, 1)

    @property
    def kh(self) -> int:
        return self._dim(self.kernel, 0)

    @property
    def kw(self) -> int:
        return self._dim(self.kernel, 1)

    @property
    def hw_stride(self) -> tuple[int, int]:
        """The stride of the first two spatial dimensions (1 for a missing one)."""
        return (self._dim(self.stride, 0), self._dim(self.stride, 1))

    @property
    def ho(self) -> int:
        return self._dim(self.out_spatial, 0)

    @property
    def wo(self) -> int:
        return self._dim(self.out_spatial, 1)


def conv_meta(target: str, arg_meta: Sequence[Any]) -> ConvMeta:
    """Parse the args of ``aten.convolution`` or ``aten.convolution_backward``.

    Forward: (input, weight, bias, stride, padding, dilation, transposed, output_padding,
    groups). Backward: (grad_output, input, weight, bias_sizes, stride, padding, dilation,
    transposed, output_padding, groups, output_mask).
    """
    args = list(arg_meta)
    if target == CONV:
        inp, weight, bias = tensor_meta(args[0]), tensor_meta(args[1]), tensor_meta(args[2])
        stride, padding, dilation, transposed, groups = args[3], args[4], args[5], args[6], args[8]
        mask: tuple[bool, bool, bool] = (True, True, True)
        bias_sizes = None
    elif target == CONV_BACKWARD:
        inp, weight, bias = tensor_meta(args[1]), tensor_meta(args[2]), None
        bias_sizes = tuple(int(s) for s in args[3]) if args[3] is not None else None
        stride, padding, dilation, transposed, groups = args[4], args[5], args[6], args[7], args[9]
        mask = (bool(args[10][0]), bool(args[10][1]), bool(args[10][2]))
    else:
        raise ValueError(f"{target} is not a convolution op")
    assert inp is not None and weight is not None
    dims = len(inp.shape) - 2
    return ConvMeta(inp, weight, bias, _spatial(stride, dims), _spatial(padding, dims),
                    _spatial(dilation, dims), bool(transposed), int(groups), dims,
                    mask, bias_sizes)


@dataclass(frozen=True)
class AttentionMeta:
    """The arguments of CPU flash attention (forward or backward), as plain numbers.

    ``q: (B, H, Lq, D)``, ``k: (B, Hk, Lk, D)``, ``v: (B, Hk, Lk, Dv)``.
    """

    query: TensorMeta
    key: TensorMeta
    value: TensorMeta
    dropout_p: float
    is_causal: bool
    attn_mask: TensorMeta | None
    scale: float | None

    @property
    def dtype(self) -> str:
        return self.query.dtype

    @property
    def itemsize(self) -> int:
        return self.query.itemsize

    @property
    def b(self) -> int:
        return self.query.shape[0]

    @property
    def h(self) -> int:
        return self.query.shape[1]

    @property
    def lq(self) -> int:
        return self.query.shape[2]

    @property
    def lk(self) -> int:
        return self.key.shape[2]

    @property
    def d(self) -> int:
        return self.query.shape[3]

    @property
    def dv(self) -> int:
        return self.value.shape[3]


def attention_meta(target: str, arg_meta: Sequence[Any],
                   kwarg_meta: Mapping[str, Any] | None = None) -> AttentionMeta:
    """Parse the args of the CPU flash-attention forward or backward op.

    Forward: (query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask, scale).
    Backward: (grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *,
    attn_mask, scale).
    """
    args = list(arg_meta)
    kwargs = dict(kwarg_meta or {})
    if target == SDPA:
        q, k, v = args[0], args[1], args[2]
        rest = args[3:]
    elif target == SDPA_BACKWARD:
        q, k, v = args[1], args[2], args[3]
        rest = args[6:]
    else:
        raise ValueError(f"{target} is not a CPU flash-attention op")
    dropout_p = float(rest[0]) if len(rest) > 0 else float(kwargs.get("dropout_p", 0.0))
    is_causal = bool(rest[1]) if len(rest) > 1 else bool(kwargs.get("is_causal", False))
    query, key, value = tensor_meta(q), tensor_meta(k), tensor_meta(v)
    assert query is not None and key is not None and value is not None
    scale = kwargs.get("scale")
    return AttentionMeta(query, key, value, dropout_p, is_causal,
                         tensor_meta(kwargs.get("attn_mask")),
                         None if scale is None else float(scale))
