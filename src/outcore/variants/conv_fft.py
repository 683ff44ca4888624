"""Convolution by FFT (cuDNN's "FFT" algorithm family), forward and both backward passes.

Every pass works on the zero-padded plane of size ``P x Q = (H + 2ph) x (W + 2pw)``, which is
large enough that the circular correlation/convolution of the DFT never wraps onto an index
that is read (proof in ``workspace.conv_fft_plane``):

* forward: ``Y = irfft2( sum_c rfft2(x_pad)[n,c] * conj(rfft2(w)[o,c]) )``, sampled at the
  strided output positions;
* data gradient: the stride-dilated ``dY`` placed on the plane, ``dX = irfft2( sum_o
  rfft2(dY)[n,o] * rfft2(w)[o,c] )`` cropped at offset ``(ph, pw)``;
* weight gradient: ``dW = irfft2( sum_n rfft2(x_pad)[n,c] * conj(rfft2(dY)[n,o]) )`` cropped
  to ``kh x kw``.

The channel sums are one batched complex GEMM over the ``P * (Q//2 + 1)`` frequencies.
Workspace is the frequency-domain buffers and the padded planes alive at once; the formulas in
``workspace.conv_fft_*`` follow the allocation order of this module line by line, so keep
them in step. Preconditions: ``check_supported`` passed (2-d, groups 1, dilation 1, not
transposed, float32/float64). Outputs are new tensors; inputs are never written.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F


def _pair(v: Sequence[int]) -> tuple[int, int]:
    return (int(v[0]), int(v[0])) if len(v) == 1 else (int(v[0]), int(v[1]))


def _spectrum(x: torch.Tensor, ph: int, pw: int) -> torch.Tensor:
    """rfft2 of ``x`` zero-padded by (ph, pw) on both sides: shape (A, B, P, Q//2+1)."""
    if ph or pw:
        padded = F.pad(x, (pw, pw, ph, ph))
        return torch.fft.rfft2(padded)
    return torch.fft.rfft2(x)


def _freq_major(spec: torch.Tensor, outer_first: bool) -> torch.Tensor:
    """View (A, B, P, Qf) as (F, A, B) if ``outer_first`` else (F, B, A); no copy."""
    a, b = spec.shape[0], spec.shape[1]
    flat = spec.view(a, b, -1)
    return flat.permute(2, 0, 1) if outer_first else flat.permute(2, 1, 0)


def _from_freq_major(prod: torch.Tensor, p: int, qf: int) -> torch.Tensor:
    """View a (F, A, B) product as (A, B, P, Qf); no copy."""
    return prod.permute(1, 2, 0).view(prod.shape[1], prod.shape[2], p, qf)


def conv_forward(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int],
                 transposed: bool, output_padding: Sequence[int], groups: int) -> torch.Tensor:
    """``aten.convolution`` computed in the frequency domain."""
    (sh, sw), (ph, pw) = _pair(stride), _pair(padding)
    kh, kw = int(weight.shape[2]), int(weight.shape[3])
    p, q = input.shape[2] + 2 * ph, input.shape[3] + 2 * pw
    ho, wo = (p - kh) // sh + 1, (q - kw) // sw + 1
    xf = _spectrum(input, ph, pw)                       # (N, C, P, Qf)
    wf = torch.fft.rfft2(weight, s=(p, q))              # (O, C, P, Qf)
    wf.conj_physical_()
    yf = torch.bmm(_freq_major(xf, True), _freq_major(wf, False))  # (F, N, O)
    del xf, wf
    full = torch.fft.irfft2(_from_freq_major(yf, p, q // 2 + 1), s=(p, q))  # (N, O, P, Q)
    del yf
    out = full[:, :, : (ho - 1) * sh + 1 : sh, : (wo - 1) * sw + 1 : sw].clone(
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
    (sh, sw), (ph, pw) = _pair(stride), _pair(padding)
    n, o = grad_output.shape[0], grad_output.shape[1]
    h, w = input.shape[2], input.shape[3]
    kh, kw = int(weight.shape[2]), int(weight.shape[3])
    p, q = h + 2 * ph, w + 2 * pw
    qf = q // 2 + 1
    grad_input = grad_weight = grad_bias = None
    if output_mask[2]:  # first, so no output appears after the workspace peak
        grad_bias = grad_output.sum(dim=(0, 2, 3))
    if not (output_mask[0] or output_mask[1]):
        return grad_input, grad_weight, grad_bias
    ho, wo = grad_output.shape[2], grad_output.shape[3]
    plane = grad_output.new_zeros((n, o, p, q))         # dY dilated by the stride
    plane[:, :, : (ho - 1) * sh + 1 : sh, : (wo - 1) * sw + 1 : sw] = grad_output
    dyf = torch.fft.rfft2(plane)                        # (N, O, P, Qf)
    del plane
    if output_mask[0]:
        wf = torch.fft.rfft2(weight, s=(p, q))          # (O, C, P, Qf)
        dxf = torch.bmm(_freq_major(dyf, True), _freq_major(wf, True))  # (F, N, C)
        del wf
        full = torch.fft.irfft2(_from_freq_major(dxf, p, qf), s=(p, q))  # (N, C, P, Q)
        del dxf
        grad_input = full[:, :, ph : ph + h, pw : pw + w].clone(
            memory_format=torch.contiguous_format)
        del full
    if output_mask[1]:
        dyf.conj_physical_()
        xf = _spectrum(input, ph, pw)                   # (N, C, P, Qf)
        dwf = torch.bmm(_freq_major(xf, False), _freq_major(dyf, True))  # (F, C, O)
        del xf, dyf
        full = torch.fft.irfft2(_from_freq_major(dwf, p, qf).transpose(0, 1), s=(p, q))
        del dwf
        grad_weight = full[:, :, :kh, :kw].clone(memory_format=torch.contiguous_format)
        del full
    return grad_input, grad_weight, grad_bias
