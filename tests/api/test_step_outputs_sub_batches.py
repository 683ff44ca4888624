"""``outputs=True`` under sub-batches: the whole batch's outputs, assembled from each
sub-batch's, as eager's forward on the whole batch returns them.

A budget under the layer-wise bound splits the batch (``allow_sub_batches=True`` or
``policy="modnn"``); a training loop still reads the logits of the whole batch. The class
tested: outputs along the batch dimension (first, and second: a ``(C, B, H, W)`` view), a
tensor no sample reaches (computed from parameters only: the same in every sub-batch), the
model's own loss in a dict (the step's loss, weighted over sub-batches), plain values; an
output reduced over the batch, which no split can assemble, given as None and said; outputs too
large to sit on the device beside the step's end handed over in host memory and said so.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from split_helpers import below_the_whole_batch
from test_step_outputs import _assert_same
from torch import nn

import outcore
from outcore.errors import SubBatchWarning
from outcore.graph.batch_dims import LOSS_COPY, UNASSEMBLED
from outcore.graph.bounds import reference_peaks
from outcore.runtime.sub_batch_assembly import after_step, assemble_outputs

X, Y = torch.randn(32, 3, 16, 16), torch.randint(0, 10, (32,))


class _Net(nn.Module):
    def __init__(self, returns: str) -> None:
        super().__init__()
        self.returns = returns
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.Flatten())
        self.head = nn.Linear(8 * 16 * 16, 10)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> Any:
        features = self.body(x)
        logits = self.head(features)
        if self.returns == "tensor":
            return logits
        if self.returns == "tuple":  # batch second; parameters only; a plain value
            return (logits, logits.t(), self.head.weight.norm(), "a label")
        if self.returns == "features":  # batch-sized and large: 256 KiB at the full batch
            return logits, features
        if self.returns == "mean":  # a statistic over the batch: no split assembles it
            return logits, logits.mean()
        return {"loss": F.cross_entropy(logits, labels), "logits": logits}


def _loss(out: Any, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out[0] if isinstance(out, tuple) else out, y)


def _compile(model: nn.Module, returns: str, **how: Any) -> Any:
    loss_fn = None if returns == "dict" else _loss
    batch = {"x": X, "labels": Y} if returns == "dict" else (X, Y)
    graph = outcore.capture(model, loss_fn, batch, outputs=True)
    budget = int(reference_peaks(graph).layer_lower_bound * 0.7)  # under it: a split
    return outcore.compile(model, loss_fn, batch, budget=budget, device="cpu-emulated",
                           outputs=True, **how)


def _assert_close(ours: Any, eager: Any) -> None:
    _assert_same(ours, eager, close=True)


@pytest.mark.parametrize("how", [{"allow_sub_batches": True}, {"policy": "modnn"}])
@pytest.mark.parametrize("returns", ["tensor", "tuple", "dict"])
def test_sub_batches_assemble_the_whole_batchs_outputs(returns: str, how: dict) -> None:
    torch.manual_seed(0)
    model = _Net(returns)
    reference = copy.deepcopy(model)
    with pytest.warns(SubBatchWarning, match="sub-batches"):
        trainer = _compile(model, returns, **how)
    assert trainer.stats.sub_batches > 1
    for step in range(2):  # the second step reuses the plan: outputs are its own
        x, y = X + step, Y
        for p in (*model.parameters(), *reference.parameters()):
            p.grad = None
        loss = trainer.step({"x": x, "labels": y}) if returns == "dict" else trainer.step(x, y)
        out = reference(x, y) if returns == "dict" else reference(x)
        expected = out["loss"] if returns == "dict" else _loss(out, y)
        expected.backward()
        torch.testing.assert_close(loss, expected.detach())
        _assert_close(trainer.outputs, out)
        for a, b in zip(model.parameters(), reference.parameters(), strict=True):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)


def test_on_a_real_device_the_split_steps_outputs_are_the_whole_batchs() -> None:
    """device="cpu" (kernel temporaries measured and planned): a budget below the whole
    batch's lowest peak splits, and the outputs are eager's forward on the whole batch."""
    torch.manual_seed(0)
    model = _Net("tensor")
    reference = copy.deepcopy(model)
    budget = below_the_whole_batch(model, _loss, (X, Y), "cpu", outputs=True)
    with pytest.warns(SubBatchWarning):
        trainer = outcore.compile(model, _loss, (X, Y), budget=budget, device="cpu",
                                  outputs=True, allow_sub_batches=True)
    assert trainer.stats.sub_batches > 1
    trainer.step(X, Y)
    _assert_close(trainer.outputs, reference(X))
    assert trainer.stats.predicted_peak <= budget


def test_a_statistic_of_the_batch_is_given_as_none_and_said() -> None:
    """An output reduced over the batch (``logits.mean()``; a mixture-of-experts router's
    auxiliary loss) has no full-batch value any split gives: None in its place, named in
    a warning and the notes; the logits beside it are the whole batch's."""
    torch.manual_seed(0)
    model = _Net("mean")
    reference = copy.deepcopy(model)
    with pytest.warns(SubBatchWarning, match=r"tensor\(s\) \[1\] .* None"):
        trainer = _compile(model, "mean", allow_sub_batches=True)
    assert trainer.stats.sub_batches > 1
    assert any("statistics of the whole batch" in note for note in trainer.stats.notes)
    trainer.step(X, Y)
    logits, mean = trainer.outputs
    assert mean is None
    _assert_close(logits, reference(X)[0])


def test_outputs_too_large_for_the_device_are_handed_over_in_host_memory() -> None:
    """8 sub-batches of a 256 KiB output do not sit beside the step's end within its
    peak: the outputs are assembled in host memory, said in a warning and the notes."""
    torch.manual_seed(0)
    model = _Net("features")
    reference = copy.deepcopy(model)
    with pytest.warns(SubBatchWarning, match="handed over in host memory"):
        trainer = _compile(model, "features", allow_sub_batches=True)
    assert not after_step(trainer.executor, trainer.plan.sub_batches).outputs_on_device
    assert any("host memory" in note for note in trainer.stats.notes)
    trainer.step(X, Y)
    _assert_close(trainer.outputs, reference(X))
    assert trainer.outputs[1].device.type == "cpu"


def test_small_outputs_fit_beside_the_steps_end() -> None:
    with pytest.warns(SubBatchWarning):
        trainer = _compile(_Net("tensor"), "tensor", allow_sub_batches=True)
    assert after_step(trainer.executor, trainer.plan.sub_batches).outputs_on_device
    assert not any("host memory" in note for note in trainer.stats.notes)


def test_assembly_rules() -> None:
    """Along each output's batch dimension; the loss's copy is the weighted loss given;
    an output no sample reaches is the first sub-batch's; a statistic of the batch is
    left out."""
    graph = SimpleNamespace(meta={"output_dims": {"0": 1, "1": LOSS_COPY, "2": None,
                                                  "3": UNASSEMBLED}})
    parts = [{0: torch.full((2, 3), float(i)), 1: torch.tensor(9.0 + i),
              2: torch.tensor([7.0]), 3: torch.tensor(float(i))} for i in range(2)]
    out = assemble_outputs(graph, parts, torch.tensor(1.5, dtype=torch.float64))
    assert torch.equal(out[0], torch.cat([parts[0][0], parts[1][0]], dim=1))
    assert out[1].dtype == torch.float32 and float(out[1]) == 1.5
    assert out[2] is parts[0][2]
    assert 3 not in out  # a statistic of the batch: None in the model's output
    assert assemble_outputs(graph, [], torch.tensor(0.0)) == {}
