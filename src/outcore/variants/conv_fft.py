"""Convolution by FFT (cuDNN's "FFT" algorithm family), forward and both backward passes.

Every pass works on a zero-padded plane of size ``P x Q >= (H + 2ph) x (W + 2pw)`` (rounded
up to 2-3-5-smooth lengths, which FFTs do fast), large enough that the circular
correlation/convolution of the DFT never wraps onto an index that is read (proof in
``workspace.conv_fft_plane``):

* forward: ``Y = irfft2( sum_c rfft2(x_pad)[n,c] * conj(rfft2(w)[o,c]) )``, sampled at the
  strided output positions;
* data gradient: the stride-dilated ``dY`` placed on the plane, ``dX = irfft2( sum_o
  rfft2(dY)[n,o] * rfft2(w)[o,c] )`` cropped at offset ``(ph, pw)``;
* weight gradient: ``dW = irfft2( sum_n rfft2(x_pad)[n,c] * conj(rfft2(dY)[n,o]) )`` cropped
  to ``kh x kw``.

Planes are laid out frequency-major, (P, Q, batch, channels), and transformed over dims
(0, 1), so the channel sums are one batched complex GEMM over the ``P * (Q//2 + 1)``
frequencies on dense matrices (a (N, C, P, Q) layout makes ``bmm`` copy every matrix).
Workspace is the padded planes and frequency-domain buffers alive at once; the formulas in
``workspace.conv_fft_*`` follow the allocation order of this module line by line, so keep
them in step. What it computes is declared in ``capability.FFT`` (2-d, groups 1, dilation 1,
not transposed, float32/float64, dense row-major); the layout, groups and dilation are checked
again on the real tensors (``VariantUnsupported``). Outputs are new tensors; inputs are never
written.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from outcore.variants.errors import VariantUnsupported
from outcore.variants.workspace import fast_fft_length


def _require(target: str, transposed: bool, groups: int, dilation: Sequence[int],
             **tensors: torch.Tensor | None) -> None:
    """Refuse, on the real tensors, what ``capability.FFT`` does not declare."""
    reason = None
    if transposed or groups != 1 or any(int(d) != 1 for d in dilation):
        reason = (f"transposed={transposed}, groups={groups}, dilation={list(dilation)}: only "
                  "plain 2-d convolutions are implemented")
    for name, t in tensors.items():
        if reason is None and t is not None and (t.dim() not in (1, 4) or not t.is_contiguous()):
            reason = (f"{name} has shape {tuple(t.shape)} and strides {t.stride()} at run time, "
                      "not the dense row-major 2-d layout the plan assumed")
    if reason is not None:
        raise VariantUnsupported(target, "fft", reason)


def _pair(v: Sequence[int]) -> tuple[int, int]:
    return (int(v[0]), int(v[0])) if len(v) == 1 else (int(v[0]), int(v[1]))


def _plane(t: torch.Tensor, p: int, q: int, top: int, left: int,
           rows: slice | None = None, cols: slice | None = None) -> torch.Tensor:
    """A new zero (P, Q, A, B) plane holding ``t`` (A, B, h, w) at rows/cols (default: a
    block at (top, left))."""
    plane = t.new_zeros((p, q, t.shape[0], t.shape[1]))
    rows = rows or slice(top, top + t.shape[2])
    cols = cols or slice(left, left + t.shape[3])
    plane[rows, cols] = t.permute(2, 3, 0, 1)
    return plane


def _spectrum(plane: torch.Tensor) -> torch.Tensor:
    """rfft2 over the plane dims: (P, Q, A, B) real -> (P, Q//2+1, A, B) complex."""
    return torch.fft.rfft2(plane, dim=(0, 1))


def _matrices(spec: torch.Tensor) -> torch.Tensor:
    """View a (P, Qf, A, B) spectrum as (F, A, B) matrices; no copy."""
    return spec.view(-1, spec.shape[2], spec.shape[3])


def _inverse(prod: torch.Tensor, p: int, q: int) -> torch.Tensor:
    """irfft2 of a (F, A, B) product: a new (P, Q, A, B) real plane."""
    return torch.fft.irfft2(prod.view(p, q // 2 + 1, prod.shape[1], prod.shape[2]), s=(p, q),
                            dim=(0, 1))


def conv_forward(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int],
                 transposed: bool, output_padding: Sequence[int], groups: int) -> torch.Tensor:
    """``aten.convolution`` computed in the frequency domain."""
    _require("aten.convolution.default", transposed, groups, dilation, input=input,
             weight=weight, bias=bias)
    (sh, sw), (ph, pw) = _pair(stride), _pair(padding)
    kh, kw = int(weight.shape[2]), int(weight.shape[3])
    ho = (input.shape[2] + 2 * ph - kh) // sh + 1
    wo = (input.shape[3] + 2 * pw - kw) // sw + 1
    p, q = fast_fft_length(input.shape[2] + 2 * ph), fast_fft_length(input.shape[3] + 2 * pw)
    xf = _spectrum(_plane(input, p, q, ph, pw))         # (P, Qf, N, C)
    wf = _spectrum(_plane(weight, p, q, 0, 0))          # (P, Qf, O, C)
    wf.conj_physical_()
    yf = torch.bmm(_matrices(xf), _matrices(wf).transpose(1, 2))  # (F, N, O)
    del xf, wf
    full = _inverse(yf, p, q)                           # (P, Q, N, O)
    del yf
    out = full[: (ho - 1) * sh + 1 : sh, : (wo - 1) * sw + 1 : sw].permute(2, 3, 0, 1).clone(
        memory_format=torch.contiguous_format)
    del full
    if bias is not None:
        out.add_(bias.view(1, -1, 1, 1))
    return out


def conv_backward(grad_output: torch.Tensor, input: torch.Tensor, weight: torch.Tensor,
                  bias_sizes: Sequence[int] | None, stride: Sequence[int],
                  padding: Sequence[int], dilation: Sequence[int], transposed: bool,
                  output_padding: Sequence[int], groups: int, output_mask: Sequence[bool],
                  ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """``aten.convolution_backward`` in the frequency domain.

    Returns (grad_input, grad_weight, grad_bias) with None where ``output_mask`` is False.
    """
    _require("aten.convolution_backward.default", transposed, groups, dilation,
             grad_output=grad_output, input=input, weight=weight)
    (sh, sw), (ph, pw) = _pair(stride), _pair(padding)
    h, w = input.shape[2], input.shape[3]
    kh, kw = int(weight.shape[2]), int(weight.shape[3])
    p, q = fast_fft_length(h + 2 * ph), fast_fft_length(w + 2 * pw)
    grad_input = grad_weight = grad_bias = None
    if output_mask[2]:  # first, so no output appears after the workspace peak
        grad_bias = grad_output.sum(dim=(0, 2, 3))
    if not (output_mask[0] or output_mask[1]):
        return grad_input, grad_weight, grad_bias
    ho, wo = grad_output.shape[2], grad_output.shape[3]
    dyf = _spectrum(_plane(grad_output, p, q, 0, 0,     # dY dilated by the stride
                           slice(0, (ho - 1) * sh + 1, sh), slice(0, (wo - 1) * sw + 1, sw)))
    if output_mask[0]:
        wf = _spectrum(_plane(weight, p, q, 0, 0))      # (P, Qf, O, C)
        dxf = torch.bmm(_matrices(dyf), _matrices(wf))  # (F, N, C)
        del wf
        full = _inverse(dxf, p, q)                      # (P, Q, N, C)
        del dxf
        grad_input = full[ph : ph + h, pw : pw + w].permute(2, 3, 0, 1).clone(
            memory_format=torch.contiguous_format)
        del full
    if output_mask[1]:
        dyf.conj_physical_()
        xf = _spectrum(_plane(input, p, q, ph, pw))     # (P, Qf, N, C)
        dwf = torch.bmm(_matrices(xf).transpose(1, 2), _matrices(dyf))  # (F, C, O)
        del xf, dyf
        full = _inverse(dwf, p, q)                      # (P, Q, C, O)
        del dwf
        grad_weight = full[:kh, :kw].permute(3, 2, 0, 1).clone(
            memory_format=torch.contiguous_format)
        del full
    return grad_input, grad_weight, grad_bias
