"""Mixtures of experts on ``torch._grouped_mm`` train as eager does, in every dtype eager's
kernel takes (``outcore.capture.eager_meta``): torch's fake-tensor rule takes bfloat16 only,
so a float32 or float16 model could not be captured. Also the op's FLOPs (the cost model
priced a grouped matmul as one FLOP per output element) and torch's own rule outside a
capture (the widened rule must not leak)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from exact import train_against_eager
from torch import nn
from torch._dispatch.python import enable_python_dispatcher

import outcore
from outcore.capture.traced_as_eager import traced_as_eager
from outcore.graph.bounds import reference_peaks

DIM, HIDDEN, EXPERTS, TOP = 16, 8, 4, 2


class SortedExperts(nn.Module):
    """Top-2 routing as transformers 5 does it: tokens sorted by expert, one grouped matmul
    per projection over the groups (``offs``: the running count), weighted and summed back
    with ``index_add``. Every shape is the batch's, whatever the routing."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.router = nn.Linear(DIM, EXPERTS, dtype=dtype)
        self.up = nn.Parameter(torch.randn(EXPERTS, DIM, HIDDEN, dtype=dtype) / 4)
        self.down = nn.Parameter(torch.randn(EXPERTS, HIDDEN, DIM, dtype=dtype) / 4)
        self.head = nn.Linear(DIM, 3, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, chosen = self.router(x).softmax(-1).topk(TOP, dim=-1)
        order = chosen.flatten().argsort(stable=True)
        token = order // TOP
        counts = torch.histc(chosen.flatten().float(), bins=EXPERTS, min=0, max=EXPERTS - 1)
        offs = counts.cumsum(0).to(torch.int32)
        hidden = F.silu(F.grouped_mm(x[token], self.up, offs=offs))
        out = F.grouped_mm(hidden, self.down, offs=offs) * weights.flatten()[order, None]
        return self.head(torch.zeros_like(x).index_add(0, token, out) + x)


class BatchedExperts(nn.Module):
    """Every expert on its own fixed slice of the batch: two 3D operands (no ``offs``)."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.up = nn.Parameter(torch.randn(EXPERTS, DIM, HIDDEN, dtype=dtype) / 4)
        self.down = nn.Parameter(torch.randn(EXPERTS, HIDDEN, DIM, dtype=dtype) / 4)
        self.head = nn.Linear(DIM, 3, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = F.grouped_mm(x.view(EXPERTS, -1, DIM).tanh(), self.up).relu()
        out = F.grouped_mm(hidden, self.down).sigmoid()
        return self.head(out.reshape(x.size(0), DIM) * x)


def _batch(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    return torch.randn(256, DIM, dtype=dtype), torch.randint(0, 3, (256,))


def _loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out.float(), y)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("policy", ["outcore-auto", "offload-all", "superneurons"])
@pytest.mark.parametrize("build", [SortedExperts, BatchedExperts])
def test_experts_train_as_eager(build: type[nn.Module], policy: str,
                                dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    model = build(dtype)
    x, y = _batch(dtype)
    graph = outcore.capture(model, _loss, (x, y))
    peak = outcore.plan(graph, None, policy="liveness", simulate=False).predicted_peak
    floor = reference_peaks(graph).layer_lower_bound
    budget = floor + (peak - floor) * 3 // 4  # under the in-core peak: decisions are made
    # the second step runs the plan counted once (proven peak)
    trainer = train_against_eager(model, _loss, [(x, y), (x, y)], budget=budget,
                                  device="cpu-emulated", policy=policy)
    assert trainer.stats.measured_peak <= budget
    assert trainer.stats.measured_peak == trainer.stats.predicted_peak
    assert {row["decision"] for row in trainer.explain()} - {"keep"}  # something was moved
    trainer.close()


def test_grouped_mm_flops_are_a_matmuls() -> None:
    """2 x tokens x DIM x HIDDEN for the up projection, not one per output element; the
    backward's grouped matmuls (2D x 2D for the weight gradient) are priced too."""
    torch.manual_seed(0)
    graph = outcore.capture(SortedExperts(torch.float32), _loss, _batch(torch.float32))
    grouped = [op for op in graph.ops if "_grouped_mm" in op.target]
    tokens = 256 * TOP
    assert len(grouped) >= 5  # two forward, at least one input and two weight gradients
    assert {op.flops for op in grouped} >= {2.0 * tokens * DIM * HIDDEN}
    assert all(op.flops >= 2.0 * tokens * min(DIM, HIDDEN) * min(DIM, HIDDEN)
               for op in grouped)


def _meta(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="meta")


def test_rule_widened_only_inside_a_capture() -> None:
    a, b = _meta(10, DIM), _meta(EXPERTS, DIM, HIDDEN)
    offs = _meta(EXPERTS, dtype=torch.int32)
    with enable_python_dispatcher(), pytest.raises(RuntimeError, match="BF16"):
        torch._grouped_mm(a, b, offs=offs)
    with traced_as_eager(), enable_python_dispatcher():
        out = torch._grouped_mm(a, b, offs=offs)
        real = torch._grouped_mm(torch.randn(10, DIM), torch.randn(EXPERTS, DIM, HIDDEN),
                                 offs=torch.tensor([2, 5, 7, 10], dtype=torch.int32))
    assert (out.shape, out.stride(), out.dtype) == (real.shape, real.stride(), real.dtype)
    with enable_python_dispatcher(), pytest.raises(RuntimeError, match="BF16"):
        torch._grouped_mm(a, b, offs=offs)  # restored when the context closed


@pytest.mark.parametrize("case, message", [
    ((_meta(10, DIM), _meta(EXPERTS, DIM, HIDDEN, dtype=torch.bfloat16),
      _meta(EXPERTS, dtype=torch.int32)), "BF16"),  # mixed dtypes: torch's rule
    ((_meta(10, DIM), _meta(EXPERTS, DIM, HIDDEN), _meta(EXPERTS)), "int32"),
    ((_meta(10, DIM), _meta(EXPERTS, DIM, HIDDEN), None), "offs"),
    ((_meta(10, DIM + 1), _meta(EXPERTS, DIM, HIDDEN), _meta(EXPERTS, dtype=torch.int32)),
     "contraction"),
])
def test_rule_keeps_torchs_other_checks(case: tuple, message: str) -> None:
    a, b, offs = case
    with traced_as_eager(), enable_python_dispatcher(), pytest.raises(RuntimeError,
                                                                       match=message):
        torch._grouped_mm(a, b, offs=offs)


def test_bfloat16_still_sized_by_torchs_rule() -> None:
    a, b = _meta(10, DIM, dtype=torch.bfloat16), _meta(EXPERTS, DIM, HIDDEN,
                                                       dtype=torch.bfloat16)
    offs = _meta(EXPERTS, dtype=torch.int32)
    with enable_python_dispatcher():
        expected = torch._grouped_mm(a, b, offs=offs)
    with traced_as_eager(), enable_python_dispatcher():
        out = torch._grouped_mm(a, b, offs=offs)
        with pytest.raises(RuntimeError, match="bfloat16"):  # torch's out_dtype check
            torch._grouped_mm(a, b, offs=offs, out_dtype=torch.float32)
    assert (out.shape, out.stride(), out.dtype) == (expected.shape, expected.stride(),
                                                    expected.dtype)
