"""A batch sliced from a larger tensor is planned, moved and measured at its own size."""

from __future__ import annotations

import torch
from torch import nn

import outcore
from outcore.capture.batching import own_storage


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4))


def test_a_slice_of_a_dataset_is_planned_as_its_own_copy() -> None:
    data, labels = torch.randn(1024, 20), torch.randint(0, 4, (1024,))
    x, y = data[:16], labels[:16]
    sliced = outcore.compile(_net(), nn.CrossEntropyLoss(), (x, y), policy="keep-all",
                             budget=None, device="cpu-emulated")
    copied = outcore.compile(_net(), nn.CrossEntropyLoss(), (x.clone(), y.clone()),
                             policy="keep-all", budget=None, device="cpu-emulated")
    with sliced, copied:
        assert sliced.stats.predicted_peak == copied.stats.predicted_peak
        for start in (16, 32):  # later slices of the same dataset: the same plan
            sliced.step(data[start:start + 16], labels[start:start + 16])
            assert sliced.stats.measured_peak == sliced.stats.predicted_peak
        assert sliced.stats.captures == 1
        # the whole dataset would have been 80 KiB of inputs alone
        assert sliced.stats.predicted_peak < data.nbytes


def test_own_storage_copies_only_views_of_larger_storages() -> None:
    data = torch.randn(8, 4)
    leaf = torch.randn(8, 4).requires_grad_()
    grad_view = leaf.detach()[:4].requires_grad_()  # a leaf view whose .grad the user reads
    batch = {"x": data[:4], "whole": data, "g": grad_view, "n": 3}
    owned = own_storage(batch)
    assert owned["whole"] is data and owned["g"] is grad_view and owned["n"] == 3
    assert torch.equal(owned["x"], data[:4])
    assert owned["x"].untyped_storage().nbytes() == 4 * 4 * 4
