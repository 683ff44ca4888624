"""VGG (Simonyan & Zisserman 2015) and its deepened versions from vDNN and moDNN.

VGG's feature extractor is five groups of 3x3 convolutions (stride 1, pad 1) with 64, 128, 256,
512, 512 output channels, each group closed by a 2x2 max pool of stride 2; the classifier is
FC-4096 → FC-4096 → FC-1000 with dropout. Configurations A/B/D/E (VGG-11/13/16/19) differ only
in how many convolutions each group holds. The name counts weight layers (conv + 3 FC).

Deep VGG (``deep_groups``): vDNN §IV-C deepens VGG-16 "by adding 20 more CONV layers to each of
the five CONV layer groups" per 100 layers, with the group's channel count, giving
VGG-116/216/316/416. moDNN §V builds VGG-101 "by increasing the CONV layers of VGG-19" without
saying where; we use the same rule: the extra layers are spread evenly over the five groups,
a remainder going to the last groups (the cheapest in activation memory). So VGG-101 has
(18, 18, 20, 21, 21) convolutions per group. (vDNN's text says VGG-16 has "16 CONV layers";
we read the name the usual way, 13 conv + 3 FC, so VGG-116 = 113 conv + 3 FC.)
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from outcore.zoo.layers import Size2, check_positive, check_spatial, mlp_head, relu, scale

CHANNELS = (64, 128, 256, 512, 512)

#: Convolutions per group for the four published configurations.
CONFIGS: dict[int, tuple[int, ...]] = {
    11: (1, 1, 2, 2, 2),
    13: (2, 2, 2, 2, 2),
    16: (2, 2, 3, 3, 3),
    19: (2, 2, 4, 4, 4),
}


def deep_groups(depth: int, base: int = 16) -> tuple[int, ...]:
    """Convolutions per group for a VGG with ``depth`` weight layers grown from VGG-``base``.

    The ``depth - base`` extra convolutions are spread evenly over the five groups; a remainder
    goes to the last groups. ``deep_groups(116) == (22, 22, 23, 23, 23)`` (vDNN's VGG-116),
    ``deep_groups(101, base=19) == (18, 18, 20, 21, 21)`` (moDNN's VGG-101).
    """
    if base not in CONFIGS:
        raise ValueError(f"vgg: base must be one of {sorted(CONFIGS)}, got {base!r}")
    extra = depth - base
    if extra < 0:
        raise ValueError(f"vgg: depth={depth} is below the base VGG-{base}; use depth >= {base}")
    each, rest = divmod(extra, len(CHANNELS))
    groups = [n + each for n in CONFIGS[base]]
    for i in range(rest):
        groups[len(groups) - 1 - i] += 1
    return tuple(groups)


def features(
    groups: Sequence[int], *, width: float, batchnorm: bool, in_channels: int = 3
) -> tuple[nn.Sequential, int]:
    """VGG's convolutional part; returns the module and its output channel count."""
    layers: list[nn.Module] = []
    prev = in_channels
    for n_convs, channels in zip(groups, CHANNELS, strict=True):
        out = scale(channels, width)
        for _ in range(n_convs):
            layers.append(nn.Conv2d(prev, out, 3, padding=1))
            if batchnorm:
                layers.append(nn.BatchNorm2d(out))
            layers.append(relu())
            prev = out
        layers.append(nn.MaxPool2d(2, 2))
    return nn.Sequential(*layers), prev


def build_vgg(
    *,
    groups: Sequence[int],
    image_size: Size2,
    num_classes: int,
    width: float,
    batchnorm: bool,
    dropout: float,
) -> nn.Sequential:
    """A VGG with ``groups[i]`` convolutions in group i, for ``image_size`` inputs.

    ``width`` scales every channel count and the classifier's 4096 hidden units.
    There is no adaptive pooling: the classifier's input size is computed from ``image_size``
    (224 gives the published 512x7x7), so the graph holds only the paper's layers.
    """
    check_positive(width=width, num_classes=num_classes)
    if len(groups) != len(CHANNELS) or any(n < 0 for n in groups):
        raise ValueError(f"vgg: groups must be 5 non-negative counts, got {tuple(groups)}")
    final = check_spatial("vgg", image_size, lambda size: size // 32)
    feats, channels = features(groups, width=width, batchnorm=batchnorm)
    hidden = scale(4096, width)
    head = mlp_head(channels * final[0] * final[1], hidden, num_classes, dropout)
    return nn.Sequential(feats, head)


def build_vgg_deep(
    *,
    depth: int,
    base: int,
    image_size: Size2,
    num_classes: int,
    width: float,
    batchnorm: bool,
    dropout: float,
) -> nn.Sequential:
    """A VGG of ``depth`` weight layers grown from VGG-``base`` by ``deep_groups``."""
    return build_vgg(
        groups=deep_groups(depth, base), image_size=image_size, num_classes=num_classes,
        width=width, batchnorm=batchnorm, dropout=dropout,
    )  # fmt: skip
