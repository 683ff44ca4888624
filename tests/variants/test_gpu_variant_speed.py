"""One assumed GPU speed per variant: ``outcore.cost.gpu_variants`` states the rule, and its
three users (``ASSUMED_GPU``, the vDNN cuDNN table, moDNN's default pricing) return exactly
what it says; what they add on top is availability (cuDNN 4: FFT at stride 1 only) and
per-op normalisation, never a speed of their own."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

import outcore
from outcore.cost.gpu_variants import (
    ATTENTION_FACTORS,
    FFT_BOUNDS,
    KNOWN_VARIANTS,
    conv_gpu_time_factor,
    fft_factor,
    gpu_time_factor,
)
from outcore.cost.model import AnalyticCostModel
from outcore.cost.profiles import get_profile
from outcore.cost.variant_costs import ASSUMED_GPU
from outcore.graph.ir import Graph, Op, OpCategory, Phase
from outcore.policies.modnn import ConvAlgorithmCost, conv_arg_meta, default_relative_time
from outcore.policies.vdnn import TARGETS, CudnnAlgorithms, relative_time
from outcore.variants.meta import conv_meta
from outcore.variants.torchmeta import arg_meta_of

CONV_VARIANTS = ("framework", "im2col", "fft")


# ---- the rule ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("kernel", "stride", "expected"), [
    ((3, 3), (1, 1), 4 / 9),      # VGG's layers: implicit GEMM 2.25x slower than FFT
    ((2, 2), (1, 1), 1.0),        # the break-even kernel area
    ((5, 5), (1, 1), FFT_BOUNDS[0]),
    ((11, 11), (4, 4), 4 * 16 / 121),
    ((1, 1), (1, 1), FFT_BOUNDS[1]),
    ((3, 3), (2, 2), 16 / 9),     # FFT does the full stride-1 work, direct a quarter of it
    ((1, 3), (1, 1), 4 / 3),
])
def test_fft_factor_follows_kernel_area_over_stride(kernel, stride, expected):
    assert fft_factor(kernel, stride) == pytest.approx(expected)
    assert gpu_time_factor("fft", kernel, stride) == pytest.approx(expected)


def test_other_variants_do_not_depend_on_the_kernel():
    for kernel in ((1, 1), (3, 3), (7, 7)):
        assert gpu_time_factor("im2col", kernel) == 0.85
        assert gpu_time_factor("framework", kernel) == gpu_time_factor("", kernel) == 1.0
    assert {v: gpu_time_factor(v) for v in ATTENTION_FACTORS} == {"materialised": 1.0,
                                                                  "chunked": 1.1}


def test_unknown_kernel_is_priced_as_3x3_stride_1():
    assert gpu_time_factor("fft") == gpu_time_factor("fft", (3, 3), (1, 1))


def test_unknown_variant_and_bad_geometry_are_refused_with_a_fix():
    with pytest.raises(ValueError, match=r"add it in outcore\.cost\.gpu_variants"):
        gpu_time_factor("winograd")
    with pytest.raises(ValueError, match="positive"):
        fft_factor((0, 3))
    with pytest.raises(ValueError, match="not a convolution"):
        conv_gpu_time_factor("aten.mm.default", "fft", [])


# ---- the three users on a captured CNN ----------------------------------------------------------

def cnn() -> tuple[Graph, dict[int, tuple]]:
    """Convolutions of every kind the rule distinguishes, and each one's FX ``arg_meta``."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(4, 4, 1), nn.ReLU(),
                          nn.Conv2d(4, 4, 5, padding=2), nn.ReLU(),
                          nn.Conv2d(4, 4, 3, stride=2, padding=1), nn.ReLU(),
                          nn.Flatten(), nn.Linear(4 * 8 * 8, 3))
    batch = (torch.randn(2, 3, 16, 16), torch.tensor([0, 2]))
    graph = outcore.capture(model, nn.functional.cross_entropy, batch)
    meta = {o.id: arg_meta_of(n.args) for o, n in zip(graph.ops, graph.source.op_nodes, strict=True)
            if o.target in TARGETS}
    return graph, meta


@pytest.fixture(scope="module")
def captured() -> tuple[Graph, dict[int, tuple]]:
    return cnn()


def test_the_cnn_covers_every_case(captured):
    graph, meta = captured
    geometry = {((m := conv_meta(graph.ops[i].target, a)).kh, m.kw, m.stride)
                for i, a in meta.items()}
    assert geometry == {(3, 3, (1, 1)), (1, 1, (1, 1)), (5, 5, (1, 1)), (3, 3, (2, 2))}
    assert {graph.ops[i].target for i in meta} == set(TARGETS)


def test_assumed_gpu_is_the_rule_for_each_ops_own_kernel(captured):
    graph, meta = captured
    for op_id, args in meta.items():
        for variant in CONV_VARIANTS:
            op = dataclasses.replace(graph.ops[op_id], variant=variant)
            rule = conv_gpu_time_factor(op.target, variant, args)
            assert ASSUMED_GPU.time_factor(op) == pytest.approx(rule)
            recorded = op.variant_options.get(variant, {}).get("speed")
            if variant == "fft" and recorded is not None:
                assert recorded != gpu_time_factor(variant), "the CPU measurement is not used"


def test_a_1x1_fft_is_priced_slow_and_a_hand_made_op_as_3x3(captured):
    graph, meta = captured
    fft_ok = [i for i in meta if "refused" not in graph.ops[i].variant_options.get("fft", {
        "refused": "no fft option"})]
    one_by_one = [i for i in fft_ok if conv_meta(graph.ops[i].target, meta[i]).kh == 1]
    assert one_by_one, "the CNN has a 1x1 convolution FFT can run"
    op = dataclasses.replace(graph.ops[one_by_one[0]], variant="fft")
    assert ASSUMED_GPU.time_factor(op) == FFT_BOUNDS[1]
    bare = dataclasses.replace(op, variant_options={"fft": {"workspace": 0}})
    assert ASSUMED_GPU.time_factor(bare) == gpu_time_factor("fft", (3, 3), (1, 1))


def test_assumed_gpu_prices_attention_and_falls_back_for_unknown_variants():
    op = Op(0, "sdpa", "aten._scaled_dot_product_flash_attention_for_cpu.default",
            Phase.FORWARD, OpCategory.ATTENTION, [], [],
            variant_options={"chunked": {"speed": 7.0, "workspace": 8},
                             "experimental": {"speed": 3.0, "workspace": 0}})
    assert ASSUMED_GPU.time_factor(dataclasses.replace(op, variant="chunked")) == 1.1
    assert ASSUMED_GPU.time_factor(dataclasses.replace(op, variant="experimental")) == 3.0
    assert "experimental" not in KNOWN_VARIANTS


def test_vdnn_table_is_the_rule_plus_cudnn4_availability(captured):
    graph, meta = captured
    algos = CudnnAlgorithms.for_graph(graph, meta)
    supported = algos.supported()
    for op_id, args in meta.items():
        target = graph.ops[op_id].target
        m = conv_meta(target, args)
        for variant in CONV_VARIANTS:
            expected = conv_gpu_time_factor(target, variant, args)
            assert relative_time(target, variant, args) == expected
        assert ("fft" in supported[op_id]) == (m.stride == (1, 1)), "cuDNN 4: FFT at stride 1"
        rule = {v: conv_gpu_time_factor(target, v, args) for v in supported[op_id]}
        fastest = min(rule.values())
        for variant, factor in rule.items():
            op = dataclasses.replace(graph.ops[op_id], variant=variant)
            assert algos.time_factor(op) == pytest.approx(factor / fastest)


def test_modnn_default_is_the_rule(captured):
    graph, meta = captured
    base = AnalyticCostModel(get_profile("k40c"))
    raw = ConvAlgorithmCost(base, normalise=False).bind(graph)
    normalised = ConvAlgorithmCost(base).bind(graph)
    for op_id, args in meta.items():
        op = graph.ops[op_id]
        inferred = conv_arg_meta(graph, op)
        assert inferred is not None
        assert conv_meta(op.target, inferred).stride == conv_meta(op.target, args).stride
        for variant in CONV_VARIANTS:
            rule = conv_gpu_time_factor(op.target, variant, args)
            assert default_relative_time(op.target, variant, inferred) == rule
            assert raw.table(op)[variant][0] == pytest.approx(rule)
        fastest = min(f for f, _ in raw.table(op).values())
        for variant, (factor, _) in normalised.table(op).items():
            assert factor == pytest.approx(raw.table(op)[variant][0] / fastest)
    assert default_relative_time(op.target, "winograd", inferred) == 1.0


def test_fft_wins_only_where_the_rule_says(captured):
    """The policies' choices follow from the rule: FFT is the fastest conv variant on 3x3 and
    5x5 stride-1 layers, never on 1x1 or strided ones."""
    graph, meta = captured
    for op_id, args in meta.items():
        target = graph.ops[op_id].target
        m = conv_meta(target, args)
        rule = {v: conv_gpu_time_factor(target, v, args) for v in CONV_VARIANTS}
        fft_fastest = min(rule, key=rule.__getitem__) == "fft"
        assert fft_fastest == (m.kh * m.kw >= 9 and m.stride == (1, 1)), (m.kh, m.stride)
