"""Convolution variants against the framework kernel: values, every output_mask, gradcheck."""

from __future__ import annotations

import itertools

import pytest
import torch

from outcore.variants import registry
from outcore.variants.meta import CONV, CONV_BACKWARD

VARIANTS = ["im2col", "fft"]
# (N, C, H, W, O, kh, kw, stride, padding, dilation)
SHAPES = [
    (2, 3, 9, 8, 4, 3, 3, (1, 1), (1, 1), (1, 1)),
    (3, 2, 10, 7, 5, 3, 3, (2, 2), (0, 0), (1, 1)),
    (1, 4, 11, 13, 2, 5, 3, (2, 1), (2, 1), (1, 1)),
    (2, 3, 6, 6, 3, 1, 1, (1, 1), (0, 0), (1, 1)),
    (2, 2, 7, 9, 3, 2, 4, (3, 2), (1, 3), (1, 1)),
    (1, 1, 5, 5, 1, 5, 5, (1, 1), (0, 0), (1, 1)),   # kernel covers the whole input
]


def _args(shape, dtype, bias=True, seed=0):
    n, c, h, w, o, kh, kw, stride, padding, dilation = shape
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, h, w, dtype=dtype, generator=g)
    wt = torch.randn(o, c, kh, kw, dtype=dtype, generator=g)
    b = torch.randn(o, dtype=dtype, generator=g) if bias else None
    return (x, wt, b, list(stride), list(padding), list(dilation), False, [0, 0], 1)


def _tol(dtype):
    if dtype == torch.float64:
        return {"rtol": 1e-9, "atol": 1e-10}
    return {"rtol": 1e-4, "atol": 1e-4}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_forward_matches_framework(variant, shape, dtype):
    args = _args(shape, dtype, bias=shape[0] != 1)
    ref = torch.ops.aten.convolution.default(*args)
    with torch.no_grad():
        out = registry.implementation(CONV, variant)(*args)
    assert out.shape == ref.shape and out.dtype == ref.dtype and out.is_contiguous()
    torch.testing.assert_close(out, ref, **_tol(dtype))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mask", list(itertools.product([True, False], repeat=3)))
def test_backward_matches_framework_for_every_mask(variant, shape, mask):
    dtype = torch.float64
    x, wt, b, stride, padding, dilation, *_ = _args(shape, dtype)
    y = torch.ops.aten.convolution.default(x, wt, b, stride, padding, dilation, False, [0, 0], 1)
    grad = torch.randn_like(y)
    args = (grad, x, wt, [wt.shape[0]], stride, padding, dilation, False, [0, 0], 1, list(mask))
    ref = torch.ops.aten.convolution_backward.default(*args)
    with torch.no_grad():
        got = registry.implementation(CONV_BACKWARD, variant)(*args)
    assert isinstance(got, tuple) and len(got) == 3
    for want, g_ref, g in zip(mask, ref, got, strict=True):
        if want:
            assert g is not None and g.shape == g_ref.shape
            torch.testing.assert_close(g, g_ref, **_tol(dtype))
        else:
            assert g is None


def test_im2col_runs_dilation():
    shape = (2, 3, 11, 10, 4, 3, 3, (1, 2), (2, 1), (2, 3))
    args = _args(shape, torch.float64)
    ref = torch.ops.aten.convolution.default(*args)
    with torch.no_grad():
        out = registry.implementation(CONV, "im2col")(*args)
    torch.testing.assert_close(out, ref, **_tol(torch.float64))
    grad = torch.randn_like(ref)
    bargs = (grad, *args[:2], [4], *args[3:], [True, True, True])
    for g, g_ref in zip(registry.implementation(CONV_BACKWARD, "im2col")(*bargs),
                        torch.ops.aten.convolution_backward.default(*bargs), strict=True):
        torch.testing.assert_close(g, g_ref, **_tol(torch.float64))


def test_inputs_are_not_written():
    args = _args(SHAPES[0], torch.float64)
    copies = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    for variant in VARIANTS:
        with torch.no_grad():
            y = registry.implementation(CONV, variant)(*args)
            registry.implementation(CONV_BACKWARD, variant)(
                torch.ones_like(y), args[0], args[1], [4], *args[3:], [True, True, True])
        for a, c in zip(args, copies, strict=True):
            if isinstance(a, torch.Tensor):
                assert torch.equal(a, c)


class _VariantConv(torch.autograd.Function):
    """A conv whose forward and backward are both the variant's, for gradcheck."""

    @staticmethod
    def forward(ctx, x, w, b, variant, stride, padding):
        ctx.save_for_backward(x, w)
        ctx.conf = (variant, stride, padding)
        return registry.implementation(CONV, variant)(x, w, b, stride, padding, [1, 1], False,
                                                      [0, 0], 1)

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        variant, stride, padding = ctx.conf
        gx, gw, gb = registry.implementation(CONV_BACKWARD, variant)(
            grad.contiguous(), x, w, [w.shape[0]], stride, padding, [1, 1], False, [0, 0], 1,
            [True, True, True])
        return gx, gw, gb, None, None, None


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("stride,padding", [([1, 1], [1, 1]), ([2, 1], [0, 2])])
def test_gradcheck(variant, stride, padding):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 2, 6, 5, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(3, 2, 3, 2, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda x, w, b: _VariantConv.apply(x, w, b, variant, stride, padding), (x, w, b))
