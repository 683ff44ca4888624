"""Every workspace formula equals what the executor's tracker measures, byte for byte."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from outcore.variants import registry
from outcore.variants.meta import CONV, CONV_BACKWARD, SDPA, SDPA_BACKWARD, conv_meta
from outcore.variants.profile import measured_workspace
from outcore.variants.torchmeta import arg_meta_of, kwarg_meta_of
from outcore.variants.workspace import KEY_BLOCK, conv_unfolded_bytes, fast_fft_length

FLOATS = st.sampled_from([torch.float32, torch.float64])


@st.composite
def conv_calls(draw):
    dtype = draw(FLOATS)
    n, c, o = draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, 4))
    h, w = draw(st.integers(2, 11)), draw(st.integers(2, 11))
    kh, kw = draw(st.integers(1, min(h, 5))), draw(st.integers(1, min(w, 5)))
    stride = [draw(st.integers(1, 3)), draw(st.integers(1, 3))]
    padding = [draw(st.integers(0, 2)), draw(st.integers(0, 2))]
    g = torch.Generator().manual_seed(draw(st.integers(0, 9)))
    x = torch.randn(n, c, h, w, dtype=dtype, generator=g)
    wt = torch.randn(o, c, kh, kw, dtype=dtype, generator=g)
    bias = torch.randn(o, dtype=dtype, generator=g) if draw(st.booleans()) else None
    fwd = (x, wt, bias, stride, padding, [1, 1], False, [0, 0], 1)
    y = torch.ops.aten.convolution.default(*fwd)
    mask = [draw(st.booleans()) for _ in range(3)]
    bwd = (torch.randn_like(y), x, wt, [o], stride, padding, [1, 1], False, [0, 0], 1, mask)
    return fwd, bwd


@settings(max_examples=25, deadline=None)
@given(conv_calls(), st.sampled_from(["im2col", "fft"]))
def test_conv_formula_equals_tracker(calls, variant):
    for target, args in zip((CONV, CONV_BACKWARD), calls, strict=True):
        measured, _ = measured_workspace(registry.implementation(target, variant), args, {})
        formula = registry.workspace_bytes(target, variant, arg_meta_of(args))
        assert formula == measured, f"{target} {variant}: formula {formula} != tracker {measured}"


@st.composite
def attention_calls(draw):
    dtype = draw(FLOATS)
    b, h, d = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.sampled_from([1, 2, 8]))
    lq = draw(st.integers(1, 40))
    lk = draw(st.sampled_from([1, 7, KEY_BLOCK - 1, KEY_BLOCK, KEY_BLOCK + 1, 2 * KEY_BLOCK + 5]))
    causal = draw(st.booleans())
    g = torch.Generator().manual_seed(draw(st.integers(0, 9)))
    q = torch.randn(b, lq, h, d, dtype=dtype, generator=g).transpose(1, 2)
    k = torch.randn(b, h, lk, d, dtype=dtype, generator=g)
    v = torch.randn(b, h, lk, d, dtype=dtype, generator=g)
    kwargs = {}
    if draw(st.booleans()):
        kwargs["attn_mask"] = torch.randn(lq, lk, dtype=dtype, generator=g)
    if draw(st.booleans()):
        kwargs["scale"] = 0.5
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(
        q, k, v, 0.0, causal, **kwargs)
    bwd = (torch.randn_like(out), q, k, v, out, lse, 0.0, causal)
    return (q, k, v, 0.0, causal), bwd, kwargs


@settings(max_examples=25, deadline=None)
@given(attention_calls(), st.sampled_from(["materialised", "chunked"]))
def test_attention_formula_equals_tracker(calls, variant):
    fwd, bwd, kwargs = calls
    for target, args in ((SDPA, fwd), (SDPA_BACKWARD, bwd)):
        measured, _ = measured_workspace(registry.implementation(target, variant), args, kwargs)
        formula = registry.workspace_bytes(target, variant, arg_meta_of(args),
                                           kwarg_meta_of(kwargs))
        assert formula == measured, f"{target} {variant}: formula {formula} != tracker {measured}"


def test_framework_is_zero_workspace_and_measures_zero():
    x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    args = (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    assert registry.workspace_bytes(CONV, "framework", arg_meta_of(args)) == 0
    measured, _ = measured_workspace(registry.implementation(CONV, "framework"), args, {})
    assert measured == 0


# ---- the sizes the issue names, from plain data -----------------------------------------------

VGG = ((8, 64, 56, 56), "float32"), ((128, 64, 3, 3), "float32"), ((128,), "float32")


def test_fast_fft_lengths():
    assert [fast_fft_length(n) for n in (1, 7, 11, 58, 60, 97, 121)] == [1, 8, 12, 60, 60, 100, 125]


def test_im2col_workspace_is_the_unfolded_matrix():
    meta = (*VGG, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    expected = 8 * (64 * 3 * 3) * (56 * 56) * 4
    assert conv_unfolded_bytes(conv_meta(CONV, meta)) == expected
    assert registry.workspace_bytes(CONV, "im2col", meta) == expected
    bmeta = (((8, 128, 56, 56), "float32"), VGG[0], VGG[1], [128], [1, 1], [1, 1], [1, 1],
             False, [0, 0], 1, [True, True, True])
    assert registry.workspace_bytes(CONV_BACKWARD, "im2col", bmeta) == expected
    only_bias = (*bmeta[:-1], [False, False, True])
    assert registry.workspace_bytes(CONV_BACKWARD, "im2col", only_bias) == 0


def test_fft_workspace_by_hand_for_a_vgg_layer():
    """3x3 pad 1 on 56x56: 58 rounds up to the 2-3-5-smooth 60, so a 60x60 plane and
    60x31 complex64 spectra. The peak is while the
    weight is transformed: input spectrum + the weight's padded plane + its spectrum; the
    output (not yet allocated then) is not workspace, so W = that peak - output bytes."""
    meta = (*VGG, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    x_spectrum = 8 * 64 * 60 * 31 * 8
    w_plane = 128 * 64 * 60 * 60 * 4
    w_spectrum = 128 * 64 * 60 * 31 * 8
    output = 8 * 128 * 56 * 56 * 4
    assert registry.workspace_bytes(CONV, "fft", meta) == (
        x_spectrum + w_plane + w_spectrum - output)


def _attn_meta(b, h, lq, lk, d, causal=False):
    t = ((b, h, lq, d), "float32")
    kv = ((b, h, lk, d), "float32")
    return (t, kv, kv, 0.0, causal)


def test_materialised_attention_holds_the_score_matrix():
    b, h, length, d = 4, 8, 512, 64
    scores = b * h * length * length * 4
    ws = registry.workspace_bytes(SDPA, "materialised", _attn_meta(b, h, length, length, d))
    assert scores <= ws < scores * 1.01
    grad = ((b, h, length, d), "float32")
    lse = ((b, h, length), "float32")
    bmeta = (grad, *_attn_meta(b, h, length, length, d)[:3], grad, lse, 0.0, False)
    assert 2 * scores - 3 * b * h * length * d * 4 <= registry.workspace_bytes(
        SDPA_BACKWARD, "materialised", bmeta) <= 2 * scores


def test_chunked_attention_workspace_grows_with_the_block_not_the_keys():
    short = registry.workspace_bytes(SDPA, "chunked", _attn_meta(4, 8, 512, 512, 64))
    long = registry.workspace_bytes(SDPA, "chunked", _attn_meta(4, 8, 512, 8192, 64))
    block = 4 * 8 * 512 * KEY_BLOCK * 4
    assert short == long and block <= short < 2 * block
    assert short < registry.workspace_bytes(SDPA, "materialised", _attn_meta(4, 8, 512, 512, 64))
