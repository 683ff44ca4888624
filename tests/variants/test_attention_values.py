"""Attention variants against the CPU flash-attention kernel: values, strides, gradcheck."""

from __future__ import annotations

import pytest
import torch

from outcore.variants import registry, workspace
from outcore.variants.meta import SDPA, SDPA_BACKWARD

FWD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
BWD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default
VARIANTS = ["materialised", "chunked"]


def _qkv(b, h, lq, lk, d, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    # laid out (B, L, H, D) and transposed, as a captured transformer gives them
    q = torch.randn(b, lq, h, d, dtype=dtype, generator=g).transpose(1, 2)
    k = torch.randn(b, lk, h, d, dtype=dtype, generator=g).transpose(1, 2)
    v = torch.randn(b, lk, h, d, dtype=dtype, generator=g).transpose(1, 2)
    return q, k, v


CASES = [
    # (B, H, Lq, Lk, D, causal, mask, scale)
    (2, 3, 5, 7, 4, False, None, None),
    (2, 2, 9, 9, 8, True, None, None),
    (1, 2, 70, 150, 4, False, "full", None),          # Lk spans 3 key blocks, last partial
    (2, 1, 130, 130, 2, True, None, 0.3),
    (1, 3, 4, 64, 16, True, "broadcast", None),        # Lk == one block exactly
    (2, 2, 6, 65, 4, False, "broadcast", 2.0),         # one key past a block
]


def _mask(kind, b, h, lq, lk, dtype):
    if kind is None:
        return {}
    g = torch.Generator().manual_seed(7)
    shape = (b, h, lq, lk) if kind == "full" else (b, 1, lq, lk)
    return {"attn_mask": torch.randn(shape, dtype=dtype, generator=g)}


def _tol(dtype):
    if dtype == torch.float64:
        return {"rtol": 1e-10, "atol": 1e-10}
    return {"rtol": 1e-4, "atol": 1e-5}


def test_key_block_leaves_partial_blocks_in_cases():
    # the chunked variant must be exercised on a partial last block
    assert any(c[3] > workspace.KEY_BLOCK and c[3] % workspace.KEY_BLOCK for c in CASES)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_forward_and_backward_match_framework(variant, case, dtype):
    b, h, lq, lk, d, causal, mask, scale = case
    q, k, v = _qkv(b, h, lq, lk, d, dtype)
    kw = _mask(mask, b, h, lq, lk, dtype)
    if scale is not None:
        kw["scale"] = scale
    out, lse = FWD(q, k, v, 0.0, causal, **kw)
    grad = torch.randn_like(out)
    ref = BWD(grad, q, k, v, out, lse, 0.0, causal, **kw)
    with torch.no_grad():
        out2, lse2 = registry.implementation(SDPA, variant)(q, k, v, 0.0, causal, **kw)
        got = registry.implementation(SDPA_BACKWARD, variant)(grad, q, k, v, out, lse, 0.0,
                                                              causal, **kw)
    torch.testing.assert_close(out2, out, **_tol(dtype))
    torch.testing.assert_close(lse2, lse, **_tol(dtype))
    assert out2.stride() == out.stride() and lse2.stride() == lse.stride()
    for g, g_ref in zip(got, ref, strict=True):
        torch.testing.assert_close(g, g_ref, **_tol(dtype))
        assert g.stride() == g_ref.stride()


@pytest.mark.parametrize("variant", VARIANTS)
def test_our_forward_feeds_the_framework_backward(variant):
    q, k, v = _qkv(2, 2, 10, 80, 4)
    grad = torch.randn(2, 2, 10, 4, dtype=torch.float64)
    out, lse = FWD(q, k, v, 0.0, True)
    ref = BWD(grad, q, k, v, out, lse, 0.0, True)
    with torch.no_grad():
        out2, lse2 = registry.implementation(SDPA, variant)(q, k, v, 0.0, True)
    for g, g_ref in zip(BWD(grad, q, k, v, out2, lse2, 0.0, True), ref, strict=True):
        torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("variant", VARIANTS)
def test_fully_masked_row_gives_zero_output_and_gradients(variant):
    q, k, v = _qkv(1, 2, 4, 70, 4)
    mask = torch.zeros(4, 70, dtype=torch.float64)
    mask[1] = float("-inf")
    out, lse = FWD(q, k, v, 0.0, False, attn_mask=mask)
    grad = torch.randn_like(out)
    with torch.no_grad():
        out2, lse2 = registry.implementation(SDPA, variant)(q, k, v, 0.0, False, attn_mask=mask)
        grads = registry.implementation(SDPA_BACKWARD, variant)(
            grad, q, k, v, out2, lse2, 0.0, False, attn_mask=mask)
    assert torch.isfinite(out2).all() and torch.isfinite(lse2).all()
    torch.testing.assert_close(out2, out, rtol=1e-10, atol=1e-10)
    assert torch.equal(out2[:, :, 1], torch.zeros_like(out2[:, :, 1]))
    ref_grads = BWD(grad, q, k, v, out, lse, 0.0, False, attn_mask=mask)
    for g, g_ref in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-10)


class _VariantAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, variant, causal):
        out, lse = registry.implementation(SDPA, variant)(q, k, v, 0.0, causal)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.conf = (variant, causal)
        return out

    @staticmethod
    def backward(ctx, grad):
        variant, causal = ctx.conf
        return (*registry.implementation(SDPA_BACKWARD, variant)(grad, *ctx.saved_tensors, 0.0,
                                                                 causal), None, None)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck(variant, causal):
    q, k, v = (t.detach().requires_grad_() for t in _qkv(1, 2, 5, 67, 2))  # 2 key blocks
    assert torch.autograd.gradcheck(
        lambda q, k, v: _VariantAttention.apply(q, k, v, variant, causal), (q, k, v),
        fast_mode=True)
