"""ResNeXt-101 3D and the batch= spelling of zoo.get."""

import pytest
import torch

from outcore import zoo


def test_resnext101_3d_parameter_count_matches_the_paper():
    work = zoo.get("resnext101-3d", batch=2, fake=True)
    # Hara et al. (CVPR 2018), Table 2: ResNeXt-101 (cardinality 32) has 48.34M parameters
    assert sum(p.numel() for p in work.model.parameters()) == pytest.approx(48.34e6, rel=0.01)
    assert tuple(work.batch[0].shape) == (2, 3, 16, 112, 112)


def test_resnext3d_small_trains_one_step():
    work = zoo.get("resnext101-3d", 2, small=True)
    loss = work.loss_fn(work.model(work.batch[0]), work.batch[1])
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for p in work.model.parameters())


def test_batch_keyword():
    assert zoo.get("mlp", batch=3, small=True).batch[0].shape[0] == 3
    with pytest.raises(ValueError, match="once"):
        zoo.get("mlp", 3, batch=4)
