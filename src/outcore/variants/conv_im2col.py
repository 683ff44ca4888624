"""Convolution by im2col + GEMM (the Caffe / cuDNN "GEMM" algorithm), forward and backward.

Workspace is the unfolded matrix ``cols`` of shape (N, C*kh*kw, Ho*Wo): the forward builds
it from the input; the data gradient builds the same-sized ``dcols`` and folds it back
(col2im); the weight gradient unfolds the input again. ``dcols`` is freed before ``cols`` is
made, so the backward holds one such matrix at a time. See ``workspace.conv_im2col_*``.

Each function has exactly the signature and return structure of its ATen op, allocates new
outputs, and never writes into its inputs. They assume ``check_supported`` passed: 2-d,
groups 1, not transposed, float32/float64. Run them under ``torch.no_grad()``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F


def _geometry(weight: torch.Tensor, stride: Sequence[int], padding: Sequence[int],
              dilation: Sequence[int]) -> dict[str, tuple[int, int]]:
    def pair(v: Sequence[int]) -> tuple[int, int]:
        return (int(v[0]), int(v[0])) if len(v) == 1 else (int(v[0]), int(v[1]))
    return {"kernel_size": (int(weight.shape[2]), int(weight.shape[3])),
            "stride": pair(stride), "padding": pair(padding), "dilation": pair(dilation)}


def conv_forward(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int],
                 transposed: bool, output_padding: Sequence[int], groups: int) -> torch.Tensor:
    """``aten.convolution`` by unfold + one GEMM per sample written into the output."""
    geo = _geometry(weight, stride, padding, dilation)
    n, o = input.shape[0], weight.shape[0]
    cols = F.unfold(input, **geo)  # (N, K, L): the workspace
    length = cols.shape[2]
    w2 = weight.reshape(o, -1)  # a view for a contiguous weight
    out = torch.empty((n, o, length), dtype=input.dtype, device=input.device)
    for i in range(n):
        torch.mm(w2, cols[i], out=out[i])
    del cols
    if bias is not None:
        out.add_(bias.view(1, o, 1))
    ho, wo = _out_hw(input, weight, geo)
    return out.view(n, o, ho, wo)


def _out_hw(input: torch.Tensor, weight: torch.Tensor,
            geo: dict[str, tuple[int, int]]) -> tuple[int, int]:
    (kh, kw), (sh, sw) = geo["kernel_size"], geo["stride"]
    (ph, pw), (dh, dw) = geo["padding"], geo["dilation"]
    ho = (input.shape[2] + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    wo = (input.shape[3] + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    return ho, wo


def conv_backward(grad_output: torch.Tensor, input: torch.Tensor, weight: torch.Tensor,
                  bias_sizes: Sequence[int] | None, stride: Sequence[int],
                  padding: Sequence[int], dilation: Sequence[int], transposed: bool,
                  output_padding: Sequence[int], groups: int, output_mask: Sequence[bool],
                  ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """``aten.convolution_backward``: col2im for the data gradient, im2col for the weight's.

    Returns (grad_input, grad_weight, grad_bias) with None where ``output_mask`` is False.
    """
    geo = _geometry(weight, stride, padding, dilation)
    n, o = grad_output.shape[0], weight.shape[0]
    dy = grad_output.reshape(n, o, -1)  # a view for a contiguous grad_output
    grad_input = grad_weight = grad_bias = None
    if output_mask[2]:  # first, so no output appears after the workspace peak
        grad_bias = grad_output.sum(dim=(0, 2, 3))
    if output_mask[0]:
        w2 = weight.reshape(o, -1)
        dcols = torch.empty((n, w2.shape[1], dy.shape[2]), dtype=dy.dtype, device=dy.device)
        for i in range(n):
            torch.mm(w2.t(), dy[i], out=dcols[i])
        grad_input = F.fold(dcols, output_size=(input.shape[2], input.shape[3]), **geo)
        del dcols
    if output_mask[1]:
        cols = F.unfold(input, **geo)
        gw = torch.zeros((o, cols.shape[1]), dtype=dy.dtype, device=dy.device)
        for i in range(n):
            gw.addmm_(dy[i], cols[i].t())
        del cols
        grad_weight = gw.view(weight.shape)
    return grad_input, grad_weight, grad_bias
