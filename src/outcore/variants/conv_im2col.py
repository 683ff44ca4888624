"""Convolution by im2col + GEMM (the Caffe / cuDNN "GEMM" algorithm), forward and backward,
for 1-, 2- and 3-d convolutions with any stride, padding, dilation and groups.

Workspace is the unfolded matrix ``cols`` of shape (N, C*prod(kernel), prod(output)): the
forward builds it from the input; the data gradient builds the same-sized ``dcols`` and folds
it back (col2im); the weight gradient unfolds the input again. ``dcols`` is freed before
``cols`` is made, so the backward holds one such matrix at a time. See
``workspace.conv_im2col_*``. Groups split the rows of ``cols`` (channel-major) into G blocks
and the weight into G matrices: one batched GEMM per sample.

The unfold and fold are our own: one strided slice copy (or add) per kernel offset, into a
buffer allocated here. (``F.unfold``'s kernel may return a tensor on a storage larger than
its shape, which would make the workspace differ from the unfolded matrix's bytes.)

Each function has exactly the signature and return structure of its ATen op, allocates new
outputs (dense, row-major), and never writes into its inputs. What they can compute is
declared in ``capability.IM2COL``; they check its layout and dtype conditions on the real
tensors at run time too (a layout capture did not foresee raises ``VariantUnsupported``
instead of computing into the wrong strides). Run them under ``torch.no_grad()``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from outcore.variants.errors import VariantUnsupported

_FORWARD = "aten.convolution.default"
_BACKWARD = "aten.convolution_backward.default"


@dataclass(frozen=True)
class _Geometry:
    """Spatial sizes of input, kernel and output, and stride/padding/dilation, per dim."""

    size: tuple[int, ...]
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]

    @property
    def out(self) -> tuple[int, ...]:
        return tuple((s + 2 * p - d * (k - 1) - 1) // st + 1 for s, k, st, p, d in
                     zip(self.size, self.kernel, self.stride, self.padding, self.dilation,
                         strict=True))

    def taps(self) -> Iterator[tuple[tuple[int, ...], tuple[slice, ...], tuple[slice, ...]]]:
        """For each kernel offset that touches the input: (offset, output slices, input
        slices), the input ones strided by the stride."""
        per_dim: list[list[tuple[int, slice, slice]]] = []
        for size, k, st, p, d, out in zip(self.size, self.kernel, self.stride, self.padding,
                                          self.dilation, self.out, strict=True):
            touching = []
            for u in range(k):
                o, i = _valid(size, out, st, p, u * d)
                if o is not None and i is not None:
                    touching.append((u, o, i))
            per_dim.append(touching)
        for combo in itertools.product(*per_dim):
            yield (tuple(u for u, _, _ in combo), tuple(o for _, o, _ in combo),
                   tuple(i for _, _, i in combo))


def _valid(size: int, out: int, stride: int, pad: int, offset: int
           ) -> tuple[slice | None, slice | None]:
    """Output indices i with 0 <= i*stride - pad + offset < size, and the input slice."""
    first = max(0, -(-(pad - offset) // stride))
    last = min(out - 1, (size - 1 + pad - offset) // stride)
    if first > last:
        return None, None
    start = first * stride - pad + offset
    return slice(first, last + 1), slice(start, start + (last - first) * stride + 1, stride)


def _geometry(input: torch.Tensor, weight: torch.Tensor, stride: Sequence[int],
              padding: Sequence[int], dilation: Sequence[int]) -> _Geometry:
    dims = input.dim() - 2

    def full(v: Sequence[int]) -> tuple[int, ...]:
        return tuple(int(v[0]) for _ in range(dims)) if len(v) == 1 else tuple(int(x) for x in v)

    return _Geometry(tuple(int(s) for s in input.shape[2:]),
                     tuple(int(k) for k in weight.shape[2:]), full(stride), full(padding),
                     full(dilation))


def _require(target: str, transposed: bool, **tensors: torch.Tensor | None) -> None:
    """Refuse, on the real tensors, what ``capability.IM2COL`` does not declare."""
    if transposed:
        raise VariantUnsupported(target, "im2col", "transposed convolutions are not implemented")
    for name, t in tensors.items():
        if t is not None and not t.is_contiguous():
            raise VariantUnsupported(target, "im2col", f"{name} has strides {t.stride()} at run "
                                     "time, not the dense row-major layout the plan assumed")


def unfold(input: torch.Tensor, g: _Geometry) -> torch.Tensor:
    """im2col: a new (N, C*prod(kernel), prod(out)) matrix; padding positions are zero."""
    n, c = input.shape[0], input.shape[1]
    cols = input.new_zeros((n, c, *g.kernel, *g.out))
    every: tuple[slice, ...] = (slice(None), slice(None))
    for offset, out_idx, in_idx in g.taps():
        cols[(*every, *offset, *out_idx)] = input[(*every, *in_idx)]  # type: ignore[index]
    return cols.view(n, c * math.prod(g.kernel), math.prod(g.out))


def fold(cols: torch.Tensor, channels: int, g: _Geometry) -> torch.Tensor:
    """col2im: a new (N, C, *size) tensor summing every column entry onto its input pixel."""
    n = cols.shape[0]
    grid = cols.view(n, channels, *g.kernel, *g.out)
    out = cols.new_zeros((n, channels, *g.size))
    every: tuple[slice, ...] = (slice(None), slice(None))
    for offset, out_idx, in_idx in g.taps():
        out[(*every, *in_idx)] += grid[(*every, *offset, *out_idx)]  # type: ignore[index]
    return out


def conv_forward(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int],
                 transposed: bool, output_padding: Sequence[int], groups: int) -> torch.Tensor:
    """``aten.convolution`` by unfold + one batched (over groups) GEMM per sample."""
    _require(_FORWARD, transposed, input=input, weight=weight, bias=bias)
    g = _geometry(input, weight, stride, padding, dilation)
    n, o = input.shape[0], weight.shape[0]
    cols = unfold(input, g)  # (N, K, L): the workspace
    k, length = cols.shape[1], cols.shape[2]
    w3 = weight.view(groups, o // groups, k // groups)
    out = input.new_empty((n, o, length))
    for i in range(n):
        torch.bmm(w3, cols[i].view(groups, k // groups, length),
                  out=out[i].view(groups, o // groups, length))
    del cols
    if bias is not None:
        out.add_(bias.view(1, o, 1))
    return out.view(n, o, *g.out)


def conv_backward(grad_output: torch.Tensor, input: torch.Tensor, weight: torch.Tensor,
                  bias_sizes: Sequence[int] | None, stride: Sequence[int],
                  padding: Sequence[int], dilation: Sequence[int], transposed: bool,
                  output_padding: Sequence[int], groups: int, output_mask: Sequence[bool],
                  ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """``aten.convolution_backward``: col2im for the data gradient, im2col for the weight's.

    Returns (grad_input, grad_weight, grad_bias) with None where ``output_mask`` is False.
    """
    _require(_BACKWARD, transposed, grad_output=grad_output, input=input, weight=weight)
    g = _geometry(input, weight, stride, padding, dilation)
    n, o = grad_output.shape[0], weight.shape[0]
    og = o // groups
    dy = grad_output.view(n, groups, og, -1)
    k = weight[0].numel() * groups  # rows of cols: C * prod(kernel)
    grad_input = grad_weight = grad_bias = None
    if output_mask[2]:  # first, so no output appears after the workspace peak
        grad_bias = grad_output.sum(dim=(0, *range(2, grad_output.dim())))
    if output_mask[0]:
        w3t = weight.view(groups, og, k // groups).transpose(1, 2)
        dcols = dy.new_empty((n, k, dy.shape[3]))
        for i in range(n):
            torch.bmm(w3t, dy[i], out=dcols[i].view(groups, k // groups, dy.shape[3]))
        grad_input = fold(dcols, input.shape[1], g)
        del dcols
    if output_mask[1]:
        cols = unfold(input, g)
        gw = dy.new_zeros((groups, og, k // groups))
        for i in range(n):
            gw.baddbmm_(dy[i], cols[i].view(groups, k // groups, -1).transpose(1, 2))
        del cols
        grad_weight = gw.view(weight.shape)
    return grad_input, grad_weight, grad_bias
