"""The user's path on a GPU: ``outcore.compile(..., device="cuda")`` trains as eager CUDA
PyTorch does, step after step, and the caching allocator's peak over a step
(``TrainerStats.measured_peak``, from ``torch.cuda.max_memory_allocated``) stays within the
budget.

Each case trains three steps of SGD with momentum twice from the same weights: once eagerly,
once through the Trainer, and compares the losses and the parameters after every step. The
budgets: unbounded and 85% of the in-core activation bytes above the static ones (outcore-auto
then offloads or recomputes), or 85% of the way from the lowest feasible peak to the in-core one
where that is below the lowest peak (ResNet-18 at batch 16 is mostly parameters). What is
asserted about memory:

* ``measured_peak <= budget``: the budget bounds what the allocator holds (issue 23,
  point 2), kernel workspaces and the allocator's 512-byte rounding included;
* ``measured_peak >= tensor_peak``: the allocator sees at least the tensors outcore tracked.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from split_helpers import below_the_whole_batch, conv_net

import outcore
from outcore import zoo
from outcore.errors import SubBatchWarning

from cuda_helpers import to_cuda

CASES = [("transformer", 8), ("resnet18", 16)]
STEPS = 3


def _budget(model, loss_fn, batch, fraction: float | None, device: str = "cuda") -> int | None:
    """``fraction`` of the in-core plan's bytes above the static ones, from an unbounded
    Trainer's prediction (kernel temporaries included, as the budgeted plan counts them)."""
    if fraction is None:
        return None
    with outcore.compile(model, loss_fn, batch, budget=None, device=device) as probe:
        peak = probe.planned.predicted_peak
        static = probe.planned.graph.static_bytes()
    budget = static + int(fraction * (peak - static))
    try:  # below the lowest peak any plan reaches (small nets are mostly parameters)?
        outcore.compile(model, loss_fn, batch, budget=budget, device=device).close()
    except outcore.InfeasibleBudgetError as exc:
        floor = exc.lowest or exc.required
        return floor + int(fraction * (peak - floor))  # the same fraction, above the floor
    return budget


@pytest.mark.parametrize("fraction", [None, 0.85], ids=["unbounded", "budget85"])
@pytest.mark.parametrize(("name", "batch_size"), CASES)
def test_compile_on_cuda_trains_as_eager_within_the_budget(name, batch_size, fraction):
    work = zoo.get(name, batch_size, small=True)
    model = work.model.cuda()
    x, y = to_cuda(tuple(work.batch))
    reference = copy.deepcopy(model)
    budget = _budget(model, work.loss_fn, (x, y), fraction)
    opt_ref = torch.optim.SGD(reference.parameters(), lr=0.01, momentum=0.9)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    worst = 0.0
    with outcore.compile(model, work.loss_fn, (x, y), budget=budget, device="cuda") as trainer:
        for step in range(STEPS):
            torch.manual_seed(step)
            want = work.loss_fn(reference(x), y)
            want.backward()
            opt_ref.step()
            opt_ref.zero_grad()
            torch.manual_seed(step)
            got = trainer.step(x, y)
            opt.step()
            opt.zero_grad()
            assert torch.allclose(got, want.detach(), rtol=1e-5, atol=1e-6), (step, got, want)
            for p, q in zip(model.parameters(), reference.parameters(), strict=True):
                worst = max(worst, float((p - q).abs().max()))
                assert torch.allclose(p, q, rtol=1e-4, atol=1e-6), (name, step)
        stats = trainer.stats
    print(f"{name} b{batch_size} budget={budget}: measured {stats.measured_peak} tracked "
          f"{stats.tensor_peak} predicted {stats.predicted_peak}; worst param diff {worst:.2e}")
    assert stats.measured_peak >= stats.tensor_peak
    if budget is not None:
        assert stats.measured_peak <= budget, (stats.measured_peak, budget, str(stats))


def test_bf16_autocast_on_cuda_matches_eager_autocast():
    work = zoo.get("transformer", 8, small=True)
    model = work.model.cuda()
    x, y = to_cuda(tuple(work.batch))
    reference = copy.deepcopy(model)
    torch.manual_seed(0)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        want = work.loss_fn(reference(x), y)
    want.backward()
    with outcore.compile(model, work.loss_fn, (x, y), budget=None, device="cuda",
                         autocast=torch.bfloat16) as trainer:
        torch.manual_seed(0)
        got = trainer.step(x, y)
    assert torch.allclose(got.float(), want.detach().float(), rtol=1e-3, atol=1e-4)
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        assert (p.grad is None) == (q.grad is None)
        if q.grad is not None:
            assert torch.allclose(p.grad.float(), q.grad.float(), rtol=1e-2, atol=1e-3)


def test_outputs_under_sub_batches_on_cuda_are_the_whole_batchs_on_the_device() -> None:
    """``outputs=True`` with a split batch on a GPU: each sub-batch's outputs wait in host
    memory (``runtime.subbatch._park``) and the assembled logits come back on the device,
    equal to eager's forward on the whole batch (the step's measured peak within the
    budget: the parked outputs are not on the device)."""
    model = conv_net().cuda()
    reference = copy.deepcopy(model)
    x = torch.randn(64, 3, 64, 64, device="cuda")
    y = torch.randint(0, 10, (64,), device="cuda")
    budget = below_the_whole_batch(model, F.cross_entropy, (x, y), "cuda", outputs=True)
    with pytest.warns(SubBatchWarning):
        trainer = outcore.compile(model, F.cross_entropy, (x, y), budget=budget,
                                  device="cuda", outputs=True, allow_sub_batches=True)
    assert trainer.stats.sub_batches > 1
    trainer.step(x, y)
    assert trainer.outputs.device.type == "cuda"
    torch.testing.assert_close(trainer.outputs, reference(x).detach(), rtol=1e-4, atol=1e-5)
