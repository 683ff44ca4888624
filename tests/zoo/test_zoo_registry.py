"""The zoo's lookup API: names, options, errors, seeding, fake mode."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from outcore import zoo

REQUIRED = [
    "mlp", "vgg11", "vgg16", "vgg19", "vgg101", "vgg116", "vgg216", "vgg316", "vgg416",
    "alexnet", "overfeat", "overfeat-accurate", "googlenet", "resnet32-cifar", "resnet18",
    "resnet34", "resnet50", "resnet101", "resnet152", "resnet-units", "densenet121",
    "inception-v4", "inception-small", "fcn", "transformer",
]  # fmt: skip


def test_names_cover_the_papers_networks_once():
    names = zoo.names()
    assert len(names) == len(set(names))
    missing = [n for n in REQUIRED if n not in names]
    assert not missing, f"zoo lacks {missing}"


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError) as err:
        zoo.get("vgg17", 2)
    message = str(err.value)
    assert "vgg17" in message
    for name in zoo.names():
        assert name in message
    assert "vgg16" in message.split("Valid names", maxsplit=1)[0]  # the close-match hint


def test_unknown_option_lists_valid_options():
    with pytest.raises(ValueError) as err:
        zoo.get("resnet50", 2, small=True, depth=50)
    message = str(err.value)
    assert "depth" in message
    for option in zoo.options("resnet50"):
        assert option in message


@pytest.mark.parametrize(
    "name, opts",
    [
        ("vgg16", {"width": "wide"}),
        ("vgg16", {"batchnorm": 1}),
        ("vgg16", {"image_size": (32, 32, 3)}),
        ("mlp", {"depth": 2.5}),
        ("mlp", {"widths": (8, "x")}),
        ("transformer", {"attention": 3}),
    ],
)
def test_option_of_wrong_type_is_refused(name, opts):
    with pytest.raises(ValueError, match=next(iter(opts))):
        zoo.get(name, 2, small=True, **opts)


@pytest.mark.parametrize(
    "name, opts, says",
    [
        ("vgg16", {"image_size": 16}, "image_size >= 32"),
        ("alexnet", {"image_size": 40}, "image_size >= 67"),
        ("overfeat", {"image_size": 50}, "image_size >= 71"),
        ("overfeat-accurate", {"image_size": 60}, "image_size >= 77"),
        ("vgg-deep", {"depth": 12}, "depth >= 16"),
        ("resnet-units", {"units": 2}, "units must be >= 4"),
        ("transformer", {"d_model": 30, "n_head": 4}, "divisible"),
        ("transformer", {"attention": "flash"}, "math"),
        ("vgg16", {"width": 0.0}, "positive"),
        ("inception-v4", {"blocks": (1, 1)}, "3 non-negative"),
    ],
)
def test_bad_option_value_says_what_to_change(name, opts, says):
    with pytest.raises(ValueError, match=says):
        zoo.get(name, 2, small=True, **opts)


@pytest.mark.parametrize("batch_size", [0, -1, 2.0, True])
def test_bad_batch_size(batch_size):
    with pytest.raises(ValueError, match="batch_size"):
        zoo.get("mlp", batch_size, small=True)


def test_options_reports_defaults_and_small_overrides():
    full, small = zoo.options("vgg16"), zoo.options("vgg16", small=True)
    assert full["image_size"] == 224 and full["width"] == 1.0
    assert small["image_size"] < 224 and small["width"] < 1.0
    assert set(full) == set(small)
    w = zoo.get("vgg16", 2, small=True, num_classes=7)
    assert w.options == {**small, "num_classes": 7}
    assert "num_classes=7" in w.description and "small" in w.description


def test_same_seed_same_workload_other_seed_differs():
    a = zoo.get("resnet18", 2, small=True, seed=3)
    b = zoo.get("resnet18", 2, small=True, seed=3)
    c = zoo.get("resnet18", 2, small=True, seed=4)
    for pa, pb in zip(a.model.parameters(), b.model.parameters(), strict=True):
        assert torch.equal(pa, pb)
    assert torch.equal(a.batch[0], b.batch[0]) and torch.equal(a.batch[1], b.batch[1])
    first = next(a.model.parameters())
    assert not torch.equal(first, next(c.model.parameters()))
    assert not torch.equal(a.batch[0], c.batch[0])


def test_get_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    zoo.get("mlp", 2, small=True, seed=9)
    assert torch.equal(torch.rand(4), expected)


def test_fake_build_stores_its_mode_and_allocates_nothing():
    w = zoo.get("vgg16", 256, fake=True)
    assert isinstance(w.fake_mode, FakeTensorMode)
    x, y = w.batch
    assert isinstance(x, FakeTensor) and x.fake_mode is w.fake_mode
    assert x.shape == (256, 3, 224, 224) and y.dtype == torch.long
    assert all(isinstance(p, FakeTensor) for p in w.model.parameters())
    with w.fake_mode:  # the caller can reuse the mode to run the step
        loss = w.loss_fn(w.model(x), y)
    assert loss.shape == () and isinstance(loss, FakeTensor)


def test_real_build_has_no_fake_mode():
    w = zoo.get("mlp", 3, small=True)
    assert w.fake_mode is None
    assert not any(isinstance(t, FakeTensor) for t in (*w.batch, *w.model.parameters()))


def test_every_option_is_used_and_small_only_overrides_options():
    import inspect

    from outcore.zoo.catalog import ENTRIES

    batch_keys = {"image_size", "num_classes", "in_features", "vocab", "seq_len", "frames"}
    for entry in ENTRIES:
        params = set(inspect.signature(entry.build).parameters)
        unused = set(entry.defaults) - params - batch_keys
        assert not unused, f"{entry.name}: options {unused} reach neither model nor batch"
        assert set(entry.small) <= set(entry.defaults), entry.name
