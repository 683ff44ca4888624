"""The zoo's building blocks and the rules that define the papers' deepened networks."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from outcore import zoo
from outcore.zoo.fcn import bilinear_kernel
from outcore.zoo.layers import conv_out, scale
from outcore.zoo.resnet import PadShortcut
from outcore.zoo.vgg import CONFIGS, deep_groups


@settings(max_examples=150, deadline=None)
@given(
    size=st.integers(1, 40),
    kernel=st.integers(1, 7),
    stride=st.integers(1, 4),
    padding=st.integers(0, 3),
    ceil=st.booleans(),
)
def test_conv_out_matches_torch_pooling(size, kernel, stride, padding, ceil):
    if padding > kernel // 2 or size + 2 * padding < kernel:
        return  # torch refuses these windows
    x = torch.zeros(1, 1, size, 1)
    y = F.max_pool2d(x, (kernel, 1), (stride, 1), (padding, 0), ceil_mode=ceil)
    assert conv_out(size, kernel, stride, padding, ceil) == y.shape[2]


def test_scale_keeps_published_counts_and_multiples():
    assert scale(64, 1.0) == 64 and scale(96, 1 / 16) == 6
    assert scale(3, 0.01) == 1
    assert scale(96, 1 / 16, multiple=4) % 4 == 0


@pytest.mark.parametrize(
    "depth, base, groups",
    [(16, 16, CONFIGS[16]), (116, 16, (22, 22, 23, 23, 23)), (216, 16, (42, 42, 43, 43, 43)),
     (416, 16, (82, 82, 83, 83, 83)), (101, 19, (18, 18, 20, 21, 21)),
     (19, 16, CONFIGS[19])],  # the rule grows VGG-16 into VGG-19
)  # fmt: skip
def test_deep_vgg_groups(depth, base, groups):
    assert deep_groups(depth, base) == groups
    assert sum(groups) + 3 == depth


def test_bilinear_upsampling_preserves_a_constant_image():
    weight = bilinear_kernel(2, 64)
    x = torch.full((1, 2, 6, 6), 3.0)
    y = F.conv_transpose2d(x, weight, stride=32)
    interior = y[:, :, 32:-32, 32:-32]
    assert torch.allclose(interior, torch.full_like(interior, 3.0))
    assert weight[0, 1].abs().sum() == 0  # channels do not mix


def test_option_a_shortcut_subsamples_and_zero_pads():
    x = torch.arange(2 * 3 * 4 * 4, dtype=torch.float32).reshape(2, 3, 4, 4)
    y = PadShortcut(extra_channels=5, stride=2)(x)
    assert y.shape == (2, 8, 2, 2)
    assert torch.equal(y[:, :3], x[:, :, ::2, ::2])
    assert y[:, 3:].abs().sum() == 0


def test_transformer_is_causal():
    w = zoo.get("transformer", 2, small=True, dropout=0.0)
    x = w.batch[0]
    changed = x.clone()
    changed[:, -1] = (changed[:, -1] + 1) % w.options["vocab"]
    a, b = w.model(x), w.model(changed)
    assert torch.allclose(a[:, :-1], b[:, :-1], atol=1e-6)
    assert not torch.allclose(a[:, -1], b[:, -1])


def test_transformer_math_and_sdpa_attention_agree():
    math = zoo.get("transformer", 2, small=True, dropout=0.0, attention="math")
    sdpa = zoo.get("transformer", 2, small=True, dropout=0.0, attention="sdpa")
    x = math.batch[0]
    assert torch.allclose(math.model(x), sdpa.model(x), atol=1e-5)


def test_transformer_ties_embedding_and_head_unless_told_not_to():
    tied = zoo.get("transformer", 2, small=True)
    assert tied.model.head.weight is tied.model.tok.weight
    untied = zoo.get("transformer", 2, small=True, tie_weights=False)
    vocab, d = untied.options["vocab"], untied.options["d_model"]
    assert untied.num_parameters() - tied.num_parameters() == vocab * d


def test_transformer_targets_are_inputs_shifted():
    x, y = zoo.get("transformer", 3, small=True).batch
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_dropout_makes_training_steps_random_and_zero_dropout_deterministic():
    w = zoo.get("vgg16", 2, small=True)
    x = w.batch[0]
    assert not torch.equal(w.model(x), w.model(x))
    quiet = zoo.get("vgg16", 2, small=True, dropout=0.0)
    assert torch.equal(quiet.model(x), quiet.model(x))


def test_mlp_widths_override_depth():
    w = zoo.get("mlp", 2, small=True, widths=(7, 5))
    linears = [m for m in w.model if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(32, 7), (7, 5), (5, 10)]
