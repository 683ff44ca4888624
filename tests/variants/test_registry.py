"""The registry's contract: names, implementations, support refusals with reasons."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from outcore.errors import OutcoreError
from outcore.variants import registry
from outcore.variants.errors import VariantUnsupported
from outcore.variants.meta import CONV, CONV_BACKWARD, SDPA, SDPA_BACKWARD

X = ((2, 3, 8, 8), "float32")
W = ((4, 3, 3, 3), "float32")
B = ((4,), "float32")
G = ((2, 4, 8, 8), "float32")


def conv(x=X, w=W, b=B, stride=(1, 1), padding=(1, 1), dilation=(1, 1), transposed=False,
         groups=1):
    return (x, w, b, list(stride), list(padding), list(dilation), transposed, [0, 0], groups)


def conv_bwd(grad=G, x=X, w=W, dilation=(1, 1), groups=1):
    return (grad, x, w, [4], [1, 1], [1, 1], list(dilation), False, [0, 0], groups,
            [True, True, True])


Q = ((2, 4, 16, 8), "float32")


def attn(q=Q, k=Q, v=Q, dropout=0.0, causal=False):
    return (q, k, v, dropout, causal)


def test_variants_for_lists_framework_first():
    assert registry.variants_for(CONV) == ["framework", "im2col", "fft"]
    assert registry.variants_for(CONV_BACKWARD) == ["framework", "im2col", "fft"]
    assert registry.variants_for(SDPA) == ["framework", "materialised", "chunked"]
    assert registry.variants_for(SDPA_BACKWARD) == ["framework", "materialised", "chunked"]
    assert registry.variants_for("aten.relu.default") == ["framework"]


def test_framework_implementation_is_the_aten_op():
    assert registry.implementation(CONV, "framework") is torch.ops.aten.convolution.default
    assert (registry.implementation(SDPA_BACKWARD, "framework")
            is torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default)


def test_unknown_variant_is_refused_everywhere():
    for call in (lambda: registry.implementation(CONV, "winograd"),
                 lambda: registry.workspace_bytes(CONV, "winograd", conv()),
                 lambda: registry.check_supported(CONV, "winograd", conv())):
        with pytest.raises(VariantUnsupported, match="known for this op"):
            call()


REFUSALS = [
    (CONV, "im2col", conv(groups=3), "groups=3"),  # 3 input channels, weight (4, 3, ...)
    (CONV, "fft", conv(groups=3), "groups=3"),
    (CONV_BACKWARD, "fft", conv_bwd(groups=3), "groups=3"),
    (CONV, "fft", conv(dilation=(2, 1)), "dilation"),
    (CONV_BACKWARD, "fft", conv_bwd(dilation=(1, 2)), "dilation"),
    (CONV, "im2col", conv(transposed=True), "transposed"),
    (CONV, "im2col", conv(x=((2, 3, 8, 8), "float16"), w=((4, 3, 3, 3), "float16"),
                          b=((4,), "float16")), "float16"),
    (CONV, "fft", conv(x=((2, 3, 8, 8), "torch.bfloat16")), "bfloat16"),
    (CONV, "im2col", conv(w=((4, 3, 3, 3), "float64")), "differs"),
    (CONV, "fft", (((2, 3, 8, 8, 8), "float32"), ((4, 3, 3, 3, 3), "float32"), None,
                   [1, 1, 1], [0, 0, 0], [1, 1, 1], False, [0, 0, 0], 1), "3-d"),
    (CONV, "im2col", conv(x=((2, 3, 8, 8), "float32", (192, 1, 24, 3))), "channels_last"),
    (CONV_BACKWARD, "im2col", conv_bwd(grad=((2, 4, 8, 8), "float16")), "grad_output"),
    (SDPA, "chunked", attn(dropout=0.1), "dropout"),
    (SDPA_BACKWARD, "materialised",
     (Q, Q, Q, Q, Q, ((2, 4, 16), "float32"), 0.1, False), "dropout"),
    (SDPA, "materialised", attn(k=((2, 2, 16, 8), "float32"), v=((2, 2, 16, 8), "float32")),
     "grouped-query"),
    (SDPA, "chunked", attn(v=((2, 4, 16, 4), "float32")), "head size"),
    (SDPA, "chunked", attn(q=((2, 4, 16, 8), "float16"), k=((2, 4, 16, 8), "float16"),
                           v=((2, 4, 16, 8), "float16")), "float16"),
]


@pytest.mark.parametrize("target,variant,meta,reason", REFUSALS)
def test_refusals_name_the_reason(target, variant, meta, reason):
    with pytest.raises(VariantUnsupported) as info:
        registry.check_supported(target, variant, meta)
    assert isinstance(info.value, OutcoreError)
    assert reason in str(info.value) and variant in str(info.value)
    assert info.value.target == target and info.value.variant == variant
    registry.check_supported(target, "framework", meta)  # the framework runs everything
    assert variant not in registry.supported_variants(target, meta)


def test_bool_mask_is_refused_as_the_framework_refuses_it():
    mask = {"attn_mask": ((16, 16), "bool")}
    with pytest.raises(VariantUnsupported, match="attn_mask dtype bool"):
        registry.check_supported(SDPA, "chunked", attn(), mask)


def test_ops_without_variants_refuse_other_names():
    with pytest.raises(VariantUnsupported):
        registry.check_supported("aten.relu.default", "im2col", ())


def test_supported_cases_pass_and_list_workspace():
    for target, meta in ((CONV, conv()), (CONV_BACKWARD, conv_bwd()), (SDPA, attn()),
                         (SDPA, attn(causal=True))):
        ws = registry.supported_variants(target, meta)
        assert list(ws) == registry.variants_for(target)
        assert ws["framework"] == 0 and all(v > 0 for k, v in ws.items() if k != "framework")
    # dilation is fine for im2col, not for fft
    assert list(registry.supported_variants(CONV, conv(dilation=(2, 2)))) == ["framework", "im2col"]


def test_planning_modules_do_not_import_torch():
    """The torch-free modules import no torch themselves. (The top-level ``outcore``
    package may import torch; the subprocess skips its __init__ to test ours alone.)"""
    import outcore

    code = (
        "import sys, types\n"
        f"pkg = types.ModuleType('outcore'); pkg.__path__ = {list(outcore.__path__)!r}\n"
        "sys.modules['outcore'] = pkg\n"
        "import outcore.variants.registry, outcore.variants.select, outcore.variants.speeds\n"
        "import outcore.variants.workspace, outcore.variants.support, outcore.variants.meta\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
