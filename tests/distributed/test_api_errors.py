"""What ``compile(..., distributed=...)`` refuses, with errors that say what to do (no
process group is started here)."""

from __future__ import annotations

import pytest
import torch

import outcore
from outcore.errors import OutcoreError


def small():
    net = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.BatchNorm1d(4))
    return net, (lambda out, y: out.pow(2).mean()), (torch.randn(4, 8), torch.zeros(4))


def test_distributed_without_a_group_or_torchrun_says_how_to_start(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    net, loss_fn, batch = small()
    with pytest.raises(OutcoreError, match="torchrun --nproc-per-node"):
        outcore.compile(net, loss_fn, batch, budget=None, device="cpu", distributed=True)


def test_distributed_must_be_true_or_a_process_group():
    net, loss_fn, batch = small()
    with pytest.raises(TypeError, match="ProcessGroup"):
        outcore.compile(net, loss_fn, batch, budget=None, device="cpu", distributed="gloo")


def test_a_share_viewing_a_larger_batch_gets_its_own_storage():
    from outcore.capture.batching import own_storage

    batch = torch.randn(8, 4)
    labels = torch.arange(8)
    share = (batch[4:], labels[:4], "meta")
    owned = own_storage(share)
    assert owned[2] == "meta"
    for view, copy in zip(share[:2], owned[:2], strict=True):
        assert torch.equal(view, copy)
        assert copy.untyped_storage().nbytes() == copy.numel() * copy.element_size()
        assert copy.untyped_storage().data_ptr() != view.untyped_storage().data_ptr()
    whole = (torch.randn(4, 4), torch.arange(4))
    assert all(a is b for a, b in zip(own_storage(whole), whole, strict=True))


def test_an_optimizer_with_distributed_is_refused_not_ignored(monkeypatch):
    """Found by the session-20 journey: the distributed branch came first, so under torchrun
    ``optimizer=`` (weights planning) was silently dropped."""
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    net, loss_fn, batch = small()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with pytest.raises(OutcoreError, match="optimizer= without distributed="):
        outcore.compile(net, loss_fn, batch, budget="1MB", device="cpu-emulated",
                        distributed=True, optimizer=opt)
