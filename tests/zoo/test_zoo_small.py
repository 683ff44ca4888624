"""Every zoo network builds small with real tensors and trains one step on the CPU."""

import pytest
import torch
from torch import nn

from outcore import zoo

#: Families whose original network uses BatchNorm (and so must have it, in training mode).
WITH_BATCHNORM = ("resnet", "resnext", "densenet", "inception")
#: Families whose original network predates BatchNorm.
WITHOUT_BATCHNORM = ("mlp", "vgg", "alexnet", "overfeat", "googlenet", "fcn", "transformer",
                     "llama")


def expected_output_shape(w: zoo.Workload, batch_size: int) -> tuple[int, ...]:
    opts = w.options
    if w.name == "transformer" or w.name.startswith("llama"):
        return (batch_size, opts["seq_len"], opts["vocab"])
    if w.name == "fcn":
        size = opts["image_size"]
        return (batch_size, opts["num_classes"], size, size)
    return (batch_size, opts["num_classes"])


@pytest.mark.parametrize("name", zoo.names())
def test_small_forward_backward(name):
    batch_size = 3
    w = zoo.get(name, batch_size, small=True)
    x, y = w.batch
    assert y.dtype == torch.long
    assert x.shape[0] == batch_size and y.shape[0] == batch_size
    assert w.model.training
    out = w.model(x)
    assert out.shape == expected_output_shape(w, batch_size)
    loss = w.loss_fn(out, y)
    assert loss.shape == () and torch.isfinite(loss)
    loss.backward()
    no_grad = [n for n, p in w.model.named_parameters() if p.grad is None]
    assert not no_grad, f"{name}: parameters without gradient: {no_grad[:5]}"
    assert all(torch.isfinite(p.grad).all() for p in w.model.parameters())


@pytest.mark.parametrize("name", zoo.names())
def test_no_in_place_activation_and_batchnorm_where_the_original_has_it(name):
    w = zoo.get(name, 2, small=True)
    modules = list(w.model.modules())
    in_place = [m for m in modules if getattr(m, "inplace", False)]
    assert not in_place, f"{name}: in-place modules {in_place[:3]}"
    has_bn = any(isinstance(m, (nn.BatchNorm2d, nn.BatchNorm3d)) for m in modules)
    if name.startswith(WITH_BATCHNORM):
        assert has_bn and all(m.training for m in modules)
    elif name.startswith(WITHOUT_BATCHNORM):
        assert not has_bn
    else:
        pytest.fail(f"{name}: add it to WITH_BATCHNORM or WITHOUT_BATCHNORM")


def test_small_keeps_the_topology_and_shrinks_the_tensors():
    small, full = zoo.get("resnet50", 2, small=True), zoo.get("resnet50", 2, fake=True)
    kinds = [type(m).__name__ for m in small.model.modules()]
    assert kinds == [type(m).__name__ for m in full.model.modules()]
    assert small.num_parameters() < full.num_parameters() / 20
    assert small.batch[0].numel() < full.batch[0].numel() / 20


def test_dymem_resnet32_without_batchnorm_trains():
    # Dymem §4.3.3 runs ResNet-32 without batch normalization for its Figure 15.
    w = zoo.get("resnet32-cifar", 2, small=True, batchnorm=False)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in w.model.modules())
    w.loss_fn(w.model(w.batch[0]), w.batch[1]).backward()


def test_rectangular_images():
    w = zoo.get("vgg16", 2, small=True, image_size=(32, 64))
    assert w.batch[0].shape == (2, 3, 32, 64)
    assert w.model(w.batch[0]).shape == (2, 10)
    seg = zoo.get("fcn", 2, small=True, image_size=(24, 40))
    assert seg.batch[1].shape == (2, 24, 40)
    assert seg.model(seg.batch[0]).shape == (2, 5, 24, 40)
