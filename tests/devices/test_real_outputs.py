"""What kernels really return beyond the graph's declared (fake) outputs is measured in the
step and charged by the memory rule (``RealOutputs``, ``measure_temporaries``): a returned
storage the graph drops (convolution backward's grad_weight under a False output mask) is
held during its instruction, and an output whose real storage is larger than declared
(``_embedding_bag``'s offset2bag, one element longer; circular padding's copies, strided
over the whole padded buffer) has its ``nbytes`` raised to it. Each class, on the devices
that count it: the emulated one (the tracker's tensor count) and the plain CPU (the
allocator)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import outcore
from outcore.capture import capture
from outcore.cost.measure_temporaries import measure_temporaries


def frozen_conv() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv1d(4, 8, 3, padding=1), nn.ReLU(),
                          nn.Conv1d(8, 8, 3, padding=1), nn.Flatten(), nn.Linear(8 * 17, 5))
    model[2].weight.requires_grad_(False)  # its bias still trains
    return model, (torch.randn(2, 4, 17), torch.tensor([0, 1]))


def bag() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.EmbeddingBag(30, 8, mode="mean"), nn.Linear(8, 5))
    return model, (torch.randint(0, 30, (8, 5)), torch.randint(0, 5, (8,)))


def circular() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, padding_mode="circular"), nn.ReLU(),
                          nn.Flatten(), nn.Linear(4 * 6 * 6, 5))
    return model, (torch.randn(2, 3, 6, 6), torch.tensor([0, 1]))


def measured(make):
    model, data = make()
    graph = capture(model, F.cross_entropy, data)
    declared = [t.nbytes for t in graph.tensors]
    measure_temporaries(graph, data, device="cpu-emulated")
    raised = {t.name: (d, t.nbytes) for t, d in zip(graph.tensors, declared, strict=True)
              if t.nbytes != d}
    return graph, raised


def test_a_returned_storage_the_graph_drops_is_held_during_its_op():
    graph, raised = measured(frozen_conv)
    held = {op.target: op.temporaries for op in graph.ops if op.temporaries}
    assert held == {"aten.convolution_backward.default": 8 * 8 * 3 * 4}  # the frozen weight's
    assert raised == {}


def test_a_storage_larger_than_declared_raises_the_tensors_bytes():
    graph, raised = measured(bag)
    assert [(after - before) for before, after in raised.values()] == [8]  # one int64 more
    assert not any(op.temporaries for op in graph.ops)
    graph, raised = measured(circular)
    padded = 2 * 3 * 8 * 8 * 4  # the whole padded buffer
    assert raised and all(before < after == padded for before, after in raised.values())


@pytest.mark.parametrize("make", [frozen_conv, bag, circular])
@pytest.mark.parametrize("device", ["cpu-emulated", "cpu"])
def test_the_step_measures_what_the_plan_predicts(make, device):
    model, data = make()
    with outcore.compile(model, F.cross_entropy, data, budget=None, device=device,
                         policy="liveness") as trainer:
        trainer.step(*data)
        stats = trainer.stats
    if device == "cpu-emulated":
        assert stats.measured_peak == stats.predicted_peak
    else:
        assert stats.measured_peak <= stats.predicted_peak
