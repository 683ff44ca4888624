"""DenseNet-BC (Huang et al. 2017): every layer reads the concatenation of all earlier maps.

A dense layer is BN → ReLU → 1x1 conv (bn_size·k channels) → BN → ReLU → 3x3 conv (k channels,
the growth rate). Inside a dense block, layer i's input is ``torch.cat`` of the block input and
the outputs of layers 0..i−1: the straightforward implementation, which materialises a fresh
concatenation per layer (the "join" SuperNeurons' Figure 1 draws, and the memory problem the
papers study). Transitions are BN → ReLU → 1x1 conv (compressing channels by θ = 0.5) → 2x2
average pool. The net ends with BN → ReLU → global average pool → FC.

* DenseNet-121 (ImageNet): 7x7/2 conv to 2k, 3x3/2 max pool, blocks (6, 12, 24, 16), k = 32.
* DenseNet-BC-100 (CIFAR, the paper's Table 2): 3x3 conv to 2k, three blocks of 16, k = 12.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from outcore.zoo.layers import check_positive, relu, scale


class DenseLayer(nn.Module):
    """BN-ReLU-Conv1x1-BN-ReLU-Conv3x3 on the concatenation of its inputs."""

    def __init__(self, in_ch: int, growth: int, bn_size: int) -> None:
        super().__init__()
        mid = bn_size * growth
        self.body = nn.Sequential(
            nn.BatchNorm2d(in_ch), relu(), nn.Conv2d(in_ch, mid, 1, bias=False),
            nn.BatchNorm2d(mid), relu(), nn.Conv2d(mid, growth, 3, padding=1, bias=False),
        )  # fmt: skip

    def forward(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        return self.body(torch.cat(inputs, dim=1))


class DenseBlock(nn.Module):
    """``n_layers`` dense layers; returns the concatenation of the input and all their outputs."""

    def __init__(self, n_layers: int, in_ch: int, growth: int, bn_size: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            DenseLayer(in_ch + i * growth, growth, bn_size) for i in range(n_layers)
        )
        self.out_channels = in_ch + n_layers * growth

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = [x]
        for layer in self.layers:
            features.append(layer(features))
        return torch.cat(features, dim=1)


def _transition(in_ch: int, out_ch: int) -> nn.Sequential:
    return nn.Sequential(
        nn.BatchNorm2d(in_ch), relu(), nn.Conv2d(in_ch, out_ch, 1, bias=False), nn.AvgPool2d(2, 2)
    )


def build_densenet(
    *,
    blocks: Sequence[int],
    growth: int,
    stem: str,
    num_classes: int,
    width: float,
    bn_size: int = 4,
    compression: float = 0.5,
) -> nn.Sequential:
    """A DenseNet-BC with ``blocks[i]`` layers in block i; ``width`` scales the growth rate.

    ``stem`` is "imagenet" (7x7/2 conv + 3x3/2 max pool) or "cifar" (one 3x3 conv).
    """
    check_positive(width=width, num_classes=num_classes, growth=growth, compression=compression)
    if not blocks or any(int(n) < 1 for n in blocks):
        raise ValueError(f"densenet: blocks must be positive layer counts, got {tuple(blocks)}")
    k = scale(growth, width)
    channels = 2 * k
    if stem == "imagenet":
        layers: list[nn.Module] = [
            nn.Conv2d(3, channels, 7, 2, padding=3, bias=False), nn.BatchNorm2d(channels), relu(),
            nn.MaxPool2d(3, 2, padding=1),
        ]  # fmt: skip
    elif stem == "cifar":
        layers = [nn.Conv2d(3, channels, 3, padding=1, bias=False)]
    else:
        raise ValueError(f"densenet: stem must be 'imagenet' or 'cifar', got {stem!r}")
    for i, n_layers in enumerate(blocks):
        block = DenseBlock(int(n_layers), channels, k, bn_size)
        layers.append(block)
        channels = block.out_channels
        if i < len(blocks) - 1:
            reduced = int(channels * compression)
            layers.append(_transition(channels, reduced))
            channels = reduced
    layers += [
        nn.BatchNorm2d(channels), relu(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(channels, num_classes),
    ]  # fmt: skip
    return nn.Sequential(*layers)
