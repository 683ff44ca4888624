"""Convolution by im2col + GEMM (the Caffe / cuDNN "GEMM" algorithm), forward and backward.

Workspace is the unfolded matrix ``cols`` of shape (N, C*kh*kw, Ho*Wo): the forward builds
it from the input; the data gradient builds the same-sized ``dcols`` and folds it back
(col2im); the weight gradient unfolds the input again. ``dcols`` is freed before ``cols`` is
made, so the backward holds one such matrix at a time. See ``workspace.conv_im2col_*``.

The unfold and fold are our own: one strided slice copy (or add) per kernel offset, into a
buffer allocated here. (``F.unfold``'s kernel may return a tensor on a storage larger than
its shape, which would make the workspace differ from the unfolded matrix's bytes.)

Each function has exactly the signature and return structure of its ATen op, allocates new
outputs, and never writes into its inputs. They assume ``check_supported`` passed: 2-d,
groups 1, not transposed, float32/float64, contiguous. Run them under ``torch.no_grad()``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class _Geometry:
    h: int
    w: int
    kh: int
    kw: int
    sh: int
    sw: int
    ph: int
    pw: int
    dh: int
    dw: int

    @property
    def ho(self) -> int:
        return (self.h + 2 * self.ph - self.dh * (self.kh - 1) - 1) // self.sh + 1

    @property
    def wo(self) -> int:
        return (self.w + 2 * self.pw - self.dw * (self.kw - 1) - 1) // self.sw + 1

    def taps(self) -> Iterator[tuple[int, int, slice, slice, slice, slice]]:
        """For each kernel offset (u, v) that touches the input: (u, v, output rows, output
        cols, input rows, input cols) as slices, the input ones strided by the stride."""
        for u in range(self.kh):
            oi, ii = _valid(self.h, self.ho, self.sh, self.ph, u * self.dh)
            if oi is None or ii is None:
                continue
            for v in range(self.kw):
                oj, ij = _valid(self.w, self.wo, self.sw, self.pw, v * self.dw)
                if oj is not None and ij is not None:
                    yield u, v, oi, oj, ii, ij


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
    def pair(v: Sequence[int]) -> tuple[int, int]:
        return (int(v[0]), int(v[0])) if len(v) == 1 else (int(v[0]), int(v[1]))
    (sh, sw), (ph, pw), (dh, dw) = pair(stride), pair(padding), pair(dilation)
    return _Geometry(int(input.shape[2]), int(input.shape[3]), int(weight.shape[2]),
                     int(weight.shape[3]), sh, sw, ph, pw, dh, dw)


def unfold(input: torch.Tensor, g: _Geometry) -> torch.Tensor:
    """im2col: a new (N, C*kh*kw, Ho*Wo) matrix; padding positions are zero."""
    n, c = input.shape[0], input.shape[1]
    cols = input.new_zeros((n, c, g.kh, g.kw, g.ho, g.wo))
    for u, v, oi, oj, ii, ij in g.taps():
        cols[:, :, u, v, oi, oj] = input[:, :, ii, ij]
    return cols.view(n, c * g.kh * g.kw, g.ho * g.wo)


def fold(cols: torch.Tensor, channels: int, g: _Geometry) -> torch.Tensor:
    """col2im: a new (N, C, H, W) tensor summing every column entry onto its input pixel."""
    n = cols.shape[0]
    grid = cols.view(n, channels, g.kh, g.kw, g.ho, g.wo)
    out = cols.new_zeros((n, channels, g.h, g.w))
    for u, v, oi, oj, ii, ij in g.taps():
        out[:, :, ii, ij] += grid[:, :, u, v, oi, oj]
    return out


def conv_forward(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int],
                 transposed: bool, output_padding: Sequence[int], groups: int) -> torch.Tensor:
    """``aten.convolution`` by unfold + one GEMM per sample written into the output."""
    g = _geometry(input, weight, stride, padding, dilation)
    n, o = input.shape[0], weight.shape[0]
    cols = unfold(input, g)  # (N, K, L): the workspace
    w2 = weight.view(o, -1)
    out = input.new_empty((n, o, g.ho * g.wo))
    for i in range(n):
        torch.mm(w2, cols[i], out=out[i])
    del cols
    if bias is not None:
        out.add_(bias.view(1, o, 1))
    return out.view(n, o, g.ho, g.wo)


def conv_backward(grad_output: torch.Tensor, input: torch.Tensor, weight: torch.Tensor,
                  bias_sizes: Sequence[int] | None, stride: Sequence[int],
                  padding: Sequence[int], dilation: Sequence[int], transposed: bool,
                  output_padding: Sequence[int], groups: int, output_mask: Sequence[bool],
                  ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """``aten.convolution_backward``: col2im for the data gradient, im2col for the weight's.

    Returns (grad_input, grad_weight, grad_bias) with None where ``output_mask`` is False.
    """
    g = _geometry(input, weight, stride, padding, dilation)
    n, o = grad_output.shape[0], weight.shape[0]
    dy = grad_output.view(n, o, -1)
    grad_input = grad_weight = grad_bias = None
    if output_mask[2]:  # first, so no output appears after the workspace peak
        grad_bias = grad_output.sum(dim=(0, 2, 3))
    if output_mask[0]:
        w2 = weight.view(o, -1)
        dcols = dy.new_empty((n, w2.shape[1], dy.shape[2]))
        for i in range(n):
            torch.mm(w2.t(), dy[i], out=dcols[i])
        grad_input = fold(dcols, input.shape[1], g)
        del dcols
    if output_mask[1]:
        cols = unfold(input, g)
        gw = dy.new_zeros((o, cols.shape[1]))
        for i in range(n):
            gw.addmm_(dy[i], cols[i].t())
        del cols
        grad_weight = gw.view(weight.shape)
    return grad_input, grad_weight, grad_bias
