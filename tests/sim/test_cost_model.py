"""The analytic roofline on hand-computed ops."""

from __future__ import annotations

import pytest

from outcore.cost.model import DEFAULT_EFFICIENCY, AnalyticCostModel, CostModel
from outcore.cost.profiles import HardwareProfile, _nearest_priced, get_profile
from outcore.errors import ProfileDtypeWarning, ProfileError
from outcore.graph.ir import Graph, Op, OpCategory, Phase, Tensor, TensorKind

PROFILE = HardwareProfile("toy", 1 << 30, {"float32": 1e12, "bfloat16": 4e12}, 1e11,
                          h2d_bandwidth=1e9, d2h_bandwidth=5e8, copy_engines=2,
                          launch_overhead=1e-5)
EFF = {"conv": 0.5, "elementwise": 0.5, "memory": 0.5}


def op(category: OpCategory, flops: float, nbytes: int, **kw: object) -> Op:
    return Op(0, "o", "t", Phase.FORWARD, category, [], [], flops=flops, bytes_touched=nbytes, **kw)


def test_compute_bound_op_uses_peak_times_efficiency() -> None:
    model = AnalyticCostModel(PROFILE, efficiency=EFF, fill_time=0.0)
    # 1e9 FLOP at 0.5 TFLOP/s = 2 ms; 1e6 bytes at 50 GB/s = 20 us
    assert model.op_time(op(OpCategory.CONV, 1e9, 10**6)) == pytest.approx(1e-5 + 2e-3)


def test_memory_bound_op_uses_bandwidth_times_efficiency() -> None:
    model = AnalyticCostModel(PROFILE, efficiency=EFF)
    # 1e8 bytes at 50 GB/s = 2 ms; 1e6 FLOP is 2 us
    assert model.op_time(op(OpCategory.ELEMENTWISE, 1e6, 10**8)) == pytest.approx(1e-5 + 2e-3)


def test_views_are_free_and_copies_cost_latency_plus_bytes() -> None:
    model = AnalyticCostModel(PROFILE)
    assert model.op_time(op(OpCategory.VIEW, 0, 10**9)) == 0
    assert model.transfer_time(10**9, "h2d") == pytest.approx(1e-5 + 1.0)
    assert model.transfer_time(10**9, "d2h") == pytest.approx(1e-5 + 2.0)
    assert model.transfer_time(0, "d2h") == 0
    with pytest.raises(ValueError, match="h2d"):
        model.transfer_time(10, "up")
    assert isinstance(model, CostModel) and model.copy_engines == 2


def test_heavy_kernels_pay_the_fill_time_per_matrix_result() -> None:
    tensors = [Tensor(0, "g", (2, 3), "float32", 24, TensorKind.INPUT, 0),
               Tensor(1, "gx", (2, 3), "float32", 24, TensorKind.GRADIENT, 1, producer=0),
               Tensor(2, "gw", (3, 3), "float32", 36, TensorKind.GRADIENT, 2, producer=0),
               Tensor(3, "gb", (3,), "float32", 12, TensorKind.GRADIENT, 3, producer=0)]
    conv_bwd = Op(0, "cb", "aten.convolution_backward.default", Phase.BACKWARD,
                  OpCategory.CONV, [0], [1, 2, 3], flops=1e9, bytes_touched=0)
    graph = Graph(tensors, [conv_bwd], outputs=[1, 2, 3], name="fill")
    model = AnalyticCostModel(PROFILE, efficiency=EFF, fill_time=1e-3).bind(graph)
    # (1e9 / 1e12 + 2 kernels * 1 ms) / 0.5 = 6 ms; the 1-D bias gradient is not a kernel
    assert model.op_time(conv_bwd) == pytest.approx(1e-5 + 6e-3)
    unbound = AnalyticCostModel(PROFILE, efficiency=EFF, fill_time=1e-3)
    assert unbound.op_time(conv_bwd) == pytest.approx(1e-5 + 8e-3)  # 3 outputs, no shapes
    relu = op(OpCategory.ELEMENTWISE, 1e9, 0)
    assert model.op_time(relu) == pytest.approx(1e-5 + 2e-3)        # no fill for light ops
    with pytest.raises(ProfileError, match="fill_time"):
        AnalyticCostModel(PROFILE, fill_time=-1.0)


def tiny_graph(dtype: str) -> Graph:
    tensors = [Tensor(0, "x", (4,), dtype, 16, TensorKind.INPUT, 0),
               Tensor(1, "y", (4,), dtype, 16, TensorKind.ACTIVATION, 1, producer=0),
               Tensor(2, "i", (4,), "int64", 32, TensorKind.ACTIVATION, 2, producer=1)]
    ops = [Op(0, "mm", "aten.mm.default", Phase.FORWARD, OpCategory.MATMUL, [0], [1],
              flops=4e12, bytes_touched=32),
           Op(1, "argmax", "aten.argmax.default", Phase.FORWARD, OpCategory.REDUCTION, [1], [2],
              flops=0.0, bytes_touched=48)]
    return Graph(tensors, ops, outputs=[2], name=f"tiny-{dtype}")


def test_bind_prices_each_op_in_its_own_dtype() -> None:
    graph = tiny_graph("bfloat16")
    model = AnalyticCostModel(PROFILE, efficiency={"matmul": 1.0}, fill_time=0).bind(graph)
    assert model.op_time(graph.ops[0]) == pytest.approx(1e-5 + 1.0)   # 4e12 / 4e12
    f32 = AnalyticCostModel(PROFILE, efficiency={"matmul": 1.0}, fill_time=0)
    assert f32.op_time(graph.ops[0]) == pytest.approx(1e-5 + 4.0)     # unbound: float32
    model.op_time(graph.ops[1])  # int64 output, float input: priced, no error


def test_a_dtype_the_profile_lacks_is_priced_from_the_nearest_with_a_warning() -> None:
    _nearest_priced.cache_clear()  # the warning is given once per process
    graph = tiny_graph("float16")
    with pytest.warns(ProfileDtypeWarning, match="'toy'.*'float16'.*bfloat16"):
        model = AnalyticCostModel(PROFILE, efficiency={"matmul": 1.0}, fill_time=0).bind(graph)
    assert model.op_time(graph.ops[0]) == pytest.approx(1e-5 + 1.0)  # the bf16 peak
    with pytest.warns(ProfileDtypeWarning, match="'tf32'.*float32"):
        AnalyticCostModel(get_profile("v100-pcie"), dtype="tf32")


def test_a_model_bound_to_one_graph_refuses_another() -> None:
    model = AnalyticCostModel(PROFILE, graph=tiny_graph("float32"))
    with pytest.raises(ProfileError, match="tiny-bfloat16"):
        model.bind(tiny_graph("bfloat16"))


def test_variants_scale_time_and_add_workspace() -> None:
    class Fast:
        def time_factor(self, o: Op) -> float:
            return 0.5 if o.variant == "winograd" else 1.0

        def workspace(self, o: Op) -> int:
            return 1234 if o.variant == "winograd" else 0

    model = AnalyticCostModel(PROFILE, efficiency=EFF, variants=Fast())
    plain = op(OpCategory.CONV, 1e9, 0)
    fast = op(OpCategory.CONV, 1e9, 0, variant="winograd")
    assert model.op_time(fast) == pytest.approx(model.op_time(plain) / 2)
    assert model.workspace(fast) == 1234 and model.workspace(plain) == 0
    assert AnalyticCostModel(PROFILE).workspace(fast) == 0


def test_efficiencies_are_fractions() -> None:
    with pytest.raises(ProfileError, match="conv"):
        AnalyticCostModel(PROFILE, efficiency={"conv": 2.0})
    assert all(0 < v <= 1 for v in DEFAULT_EFFICIENCY.values())
    assert set(DEFAULT_EFFICIENCY) == {c.value for c in OpCategory} | {"memory"}


TF32_GPU = HardwareProfile("tf32-gpu", 1 << 30, {"float32": 1e12, "tf32": 8e12}, 1e14,
                           h2d_bandwidth=1e9, d2h_bandwidth=1e9, copy_engines=2,
                           launch_overhead=0.0)


def test_float32_work_pytorch_runs_in_tf32_is_priced_at_the_tf32_peak() -> None:
    """cuDNN convolutions run float32 in TF32 by default (``torch.backends.cudnn.allow_tf32``),
    matmuls do not (``torch.backends.cuda.matmul.allow_tf32``): the model reads the flags
    when it is made, and only a profile with a tf32 peak prices them so."""
    import torch

    conv, mm = op(OpCategory.CONV, 8e9, 0), op(OpCategory.MATMUL, 8e9, 0)
    assert torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
    model = AnalyticCostModel(TF32_GPU, efficiency={"conv": 1.0, "matmul": 1.0}, fill_time=0)
    assert model.op_time(conv) == pytest.approx(1e-3)  # 8 GFLOP at 8 TFLOP/s
    assert model.op_time(mm) == pytest.approx(8e-3)  # at the float32 peak
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = False, True
        flipped = AnalyticCostModel(TF32_GPU, efficiency={"conv": 1.0, "matmul": 1.0},
                                    fill_time=0)
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved
    assert flipped.op_time(conv) == pytest.approx(8e-3)
    assert flipped.op_time(mm) == pytest.approx(1e-3)
    assert flipped.bind(tiny_graph("float32")).tf32 == flipped.tf32  # binding keeps the rule
    explicit = AnalyticCostModel(TF32_GPU, efficiency={"conv": 1.0}, fill_time=0,
                                 tf32=frozenset())
    assert explicit.op_time(conv) == pytest.approx(8e-3)
    no_tf32 = AnalyticCostModel(PROFILE, efficiency={"conv": 1.0}, fill_time=0)
    assert no_tf32.op_time(conv) == pytest.approx(1e-5 + 8e-3)  # no tf32 peak: float32's


def test_a_profile_can_give_its_own_fill_time() -> None:
    from dataclasses import replace

    heavy = op(OpCategory.MATMUL, 0.0, 0)
    own = replace(TF32_GPU, fill_time=2e-5)
    assert AnalyticCostModel(own, efficiency={"matmul": 1.0}).op_time(heavy) == \
        pytest.approx(2e-5)
    assert AnalyticCostModel(own, efficiency={"matmul": 1.0}, fill_time=0.0).op_time(heavy) == 0
    back = HardwareProfile.from_dict(own.to_dict())
    assert back.fill_time == pytest.approx(2e-5)
    assert HardwareProfile.from_dict(TF32_GPU.to_dict()).fill_time is None
