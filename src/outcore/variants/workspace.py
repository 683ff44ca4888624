"""Workspace formulas of every variant, in bytes, from plain shapes (no torch import).

Definition. The workspace W of a variant on an op is the least number such that, while the
op runs, the live device bytes never exceed ``live_before + outputs + W``, where ``outputs``
is the bytes of every output. That is exactly what ``outcore.plan.memory`` adds to a
Compute's sample, so a plan that charges W matches the executor's tracker byte for byte.

Each formula lists the *stages* of its implementation: at each point where the live set
peaks, the temporary bytes alive and the output bytes already allocated. Then

    W = max(0, max over stages of (temporaries + outputs so far) - all outputs).

The stages follow the allocation order of ``conv_im2col``, ``conv_fft`` and ``attention``
line by line (tests compare every formula with the tracker's measurement); change both
together. Internal scratch of a single ATen kernel is invisible to the tracker and is not
counted, as for the framework's own kernels, which are accounted as zero workspace.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from outcore.variants.meta import AttentionMeta, ConvMeta

#: Keys per block of the chunked attention variant (flash-attention's key tile).
KEY_BLOCK = 64


def peak_over(stages: Iterable[tuple[int, int]], outputs: int) -> int:
    """W from ``(temporaries, outputs_allocated_so_far)`` stages and the total output bytes."""
    return max(0, max((t + o for t, o in stages), default=0) - outputs)


# ---- convolution ----------------------------------------------------------------------------

def conv_unfolded_bytes(m: ConvMeta) -> int:
    """Bytes of the im2col matrix (N, C*prod(kernel), prod(output)), any dimensionality."""
    return m.n * m.c * math.prod(m.kernel) * math.prod(m.out_spatial) * m.itemsize


def conv_im2col_forward(m: ConvMeta) -> int:
    """im2col forward: the unfolded input, alive while the GEMMs write the output."""
    return conv_unfolded_bytes(m)


def conv_im2col_backward(m: ConvMeta) -> int:
    """im2col backward: one unfolded-sized matrix (dcols for dX, then cols for dW)."""
    return conv_unfolded_bytes(m) if (m.output_mask[0] or m.output_mask[1]) else 0


def fast_fft_length(n: int) -> int:
    """The least length >= n whose prime factors are 2, 3 and 5 (fast for pocketfft/cuFFT)."""
    m = max(1, n)
    while True:
        k = m
        for f in (2, 3, 5):
            while k % f == 0:
                k //= f
        if k == 1:
            return m
        m += 1


def conv_fft_plane(m: ConvMeta) -> tuple[int, int]:
    """The DFT plane: ``(H + 2ph, W + 2pw)`` each rounded up by ``fast_fft_length``.

    ``H + 2ph`` suffices, and any larger plane too: the linear correlation of the padded input
    with the kernel, the linear convolution of the stride-dilated dY (at most H + 2ph - kh + 1
    long) with the kernel (length H + 2ph), and the correlation giving dW at lags 0..kh-1 all
    fit in P without a wrapped term landing on an index that is read. Same for Q.
    """
    return (fast_fft_length(m.h + 2 * m.padding[0]), fast_fft_length(m.w + 2 * m.padding[1]))


def _fft_sizes(m: ConvMeta) -> dict[str, int]:
    p, q = conv_fft_plane(m)
    qf = q // 2 + 1
    real, cplx = m.itemsize, 2 * m.itemsize
    n, c, o = m.n, m.c, m.o
    return {
        "xpad": n * c * p * q * real,   # planes are always fresh (frequency-major copies)
        "xf": n * c * p * qf * cplx,
        "wpad": o * c * p * q * real,
        "wf": o * c * p * qf * cplx,
        "yf": n * o * p * qf * cplx,
        "yplane": n * o * p * q * real,
        "xplane": n * c * p * q * real,
        "wplane": o * c * p * q * real,
        "cf": c * o * p * qf * cplx,
    }


def conv_fft_forward(m: ConvMeta) -> int:
    """FFT forward: spectra of x and w, their product, the inverse plane, then the output."""
    s = _fft_sizes(m)
    out = m.n * m.o * m.ho * m.wo * m.itemsize
    stages = [
        (s["xpad"] + s["xf"], 0),
        (s["xf"] + s["wpad"] + s["wf"], 0),
        (s["xf"] + s["wf"] + s["yf"], 0),
        (s["yf"] + s["yplane"], 0),
        (s["yplane"], out),
    ]
    return peak_over(stages, out)


def conv_fft_backward(m: ConvMeta) -> int:
    """FFT backward: the dilated dY plane and its spectrum, then dX's and dW's pipelines."""
    want_x, want_w, want_b = m.output_mask
    if not (want_x or want_w):
        return 0
    s = _fft_sizes(m)
    gb = m.o * m.itemsize if want_b else 0
    gi = m.n * m.c * m.h * m.w * m.itemsize if want_x else 0
    gw = m.o * m.c * m.kh * m.kw * m.itemsize if want_w else 0
    dyf = s["yf"]
    stages = [(s["yplane"] + dyf, gb)]
    if want_x:
        dxf = s["xf"]  # (F, N, C) product, same bytes as the input spectrum
        stages += [
            (dyf + s["wpad"] + s["wf"], gb),
            (dyf + s["wf"] + dxf, gb),
            (dyf + dxf + s["xplane"], gb),
            (dyf + s["xplane"], gb + gi),
        ]
    if want_w:
        stages += [
            (dyf + s["xpad"] + s["xf"], gb + gi),
            (dyf + s["xf"] + s["cf"], gb + gi),
            (s["cf"] + s["wplane"], gb + gi),
            (s["wplane"], gb + gi + gw),
        ]
    return peak_over(stages, gb + gi + gw)


# ---- attention ------------------------------------------------------------------------------

def _attn_sizes(m: AttentionMeta) -> dict[str, int]:
    isz = m.itemsize
    rows = m.b * m.h * m.lq
    return {
        "row": rows * isz,                              # one value per query row
        "scores": rows * m.lk * isz,                    # (B, H, Lq, Lk)
        "block": rows * min(KEY_BLOCK, m.lk) * isz,     # (B, H, Lq, block)
        "out": rows * m.dv * isz,
        "dq": rows * m.d * isz,
        "dk": m.b * m.h * m.lk * m.d * isz,
        "dv": m.b * m.h * m.lk * m.dv * isz,
        "causal_full": m.lq * m.lk if m.is_causal else 0,           # bool mask
        "causal_block": m.lq * min(KEY_BLOCK, m.lk) if m.is_causal else 0,
    }


def attention_materialised_forward(m: AttentionMeta) -> int:
    """Scores (B, H, Lq, Lk) made, softmaxed in place, multiplied into the output."""
    s = _attn_sizes(m)
    row, lse = s["row"], s["row"]
    stages = [
        (s["scores"] + s["causal_full"], 0),
        (s["scores"] + 2 * row, lse),               # row max and row sum, lse allocated
        (s["scores"], lse + s["out"]),
    ]
    return peak_over(stages, lse + s["out"])


def attention_materialised_backward(m: AttentionMeta) -> int:
    """P and dP = dO V^T, both (B, H, Lq, Lk), alive at once."""
    s = _attn_sizes(m)
    row = s["row"]
    outs = s["dq"] + s["dk"] + s["dv"]
    stages = [
        (s["out"] + row, 0),                        # dO * O, then its row sum
        (row + s["scores"] + s["causal_full"], 0),
        (row + 2 * s["scores"], s["dv"]),
        (s["scores"], outs),
    ]
    return peak_over(stages, outs)


def attention_chunked_forward(m: AttentionMeta) -> int:
    """One (B, H, Lq, block) score buffer plus running max/sum rows."""
    s = _attn_sizes(m)
    row, lse = s["row"], s["row"]
    stages = [
        (s["block"] + 2 * row + s["causal_block"], s["out"]),
        (s["block"] + 4 * row, s["out"]),           # old max, sum, new max, block row sum
        (2 * row, s["out"] + lse),
    ]
    return peak_over(stages, s["out"] + lse)


def attention_chunked_backward(m: AttentionMeta) -> int:
    """Two (B, H, Lq, block) buffers (P and dS) per key block."""
    s = _attn_sizes(m)
    row = s["row"]
    outs = s["dq"] + s["dk"] + s["dv"]
    stages = [
        (s["out"] + row, 0),
        (row + 2 * s["block"] + s["causal_block"], outs),
    ]
    return peak_over(stages, outs)
