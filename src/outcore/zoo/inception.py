"""Inception-v4 (Szegedy et al. 2017, Figures 3-9) and a small Inception for CIFAR.

Inception-v4 is the wide fan/join net SuperNeurons, Dymem and PoocH study: a stem (Fig. 3),
4 x Inception-A (Fig. 4, 35x35x384), Reduction-A (Fig. 7 with k, l, m, n = 192, 224, 256, 384),
7 x Inception-B (Fig. 5, 17x17x1024), Reduction-B (Fig. 8), 3 x Inception-C (Fig. 6,
8x8x1536), global average pool, dropout (keep 0.8) and FC-1000. "V" in the figures means valid
(unpadded) convolution; others keep the size. Every convolution is conv (no bias) → BatchNorm →
ReLU. Where a figure's 1x7/7x1 labels are ambiguous we follow the TF-slim reference
implementation the authors released; the order does not change parameter counts. The smallest
input that reaches Inception-C with a non-empty map is 75x75 (299 is the published size).

The small model (``build_inception_small``) is the "Inception (small)" of Zhang et al. 2017
("Understanding deep learning requires rethinking generalization", Fig. 3): a 3x3 conv to 96
channels, then Inception modules (a 1x1 and a 3x3 branch, concatenated) and two downsample
modules (a stride-2 3x3 conv beside a stride-2 max pool), for 28x28 or 32x32 images.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from outcore.zoo.layers import Concat, ConvBNReLU, check_positive, scale

BN_EPS = 1e-3  # TF-slim's batch-norm epsilon


def _conv(
    in_ch: int,
    out_ch: int,
    kernel: int | tuple[int, int],
    stride: int = 1,
    padding: int | tuple[int, int] = 0,
) -> ConvBNReLU:
    return ConvBNReLU(in_ch, out_ch, kernel, stride, padding, eps=BN_EPS)


#: (out channels, kernel, stride) or (out channels, kernel, stride, "V")
Spec = tuple[Any, ...]


def _chain(in_ch: int, specs: Sequence[Spec]) -> tuple[nn.Sequential, int]:
    """Convolutions in a row, each spec (out channels, kernel (h, w), stride[, "V"]).

    A convolution is valid (unpadded) when its spec ends in "V" or its stride is 2 (every
    strided convolution of Inception-v4 is valid); otherwise it keeps the size.
    """
    layers: list[nn.Module] = []
    prev = in_ch
    for out, (kh, kw), stride, *flag in specs:
        valid = stride == 2 or flag == ["V"]
        padding = 0 if valid else (kh // 2, kw // 2)
        layers.append(_conv(prev, out, (kh, kw), stride, padding))
        prev = out
    return nn.Sequential(*layers), prev


class Split(nn.Module):
    """A shared trunk whose output feeds two convolutions that are concatenated (Fig. 6)."""

    def __init__(self, trunk: nn.Module, heads: Sequence[nn.Module]) -> None:
        super().__init__()
        self.trunk = trunk
        self.heads = nn.ModuleList(heads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.trunk(x)
        return torch.cat([head(y) for head in self.heads], dim=1)


class _Builder:
    """Builds Inception-v4 blocks with every channel count scaled by ``width``."""

    def __init__(self, width: float) -> None:
        self.width = width

    def c(self, channels: int) -> int:
        return scale(channels, self.width)

    def chain(self, in_ch: int, *specs: Spec) -> tuple[nn.Sequential, int]:
        """``_chain`` with scaled channels; a kernel may be given as one int for a square."""
        norm = [(self.c(o), k if isinstance(k, tuple) else (k, k), *rest) for o, k, *rest in specs]
        return _chain(in_ch, norm)

    def pooled(self, in_ch: int, out: int) -> nn.Sequential:
        """3x3 average pool (stride 1, padding excluded from the mean) → 1x1 conv."""
        pool = nn.AvgPool2d(3, 1, padding=1, count_include_pad=False)
        return nn.Sequential(pool, _conv(in_ch, self.c(out), 1))

    def stem(self) -> tuple[nn.Sequential, int]:
        s1, ch = self.chain(3, (32, 3, 2), (32, 3, 1, "V"), (64, 3, 1))
        b, c96 = self.chain(ch, (96, 3, 2))
        mixed3 = Concat([nn.MaxPool2d(3, 2), b])
        ch += c96
        b1, o1 = self.chain(ch, (64, 1, 1), (96, 3, 1, "V"))
        b2, o2 = self.chain(ch, (64, 1, 1), (64, (1, 7), 1), (64, (7, 1), 1), (96, 3, 1, "V"))
        mixed4 = Concat([b1, b2])
        ch = o1 + o2
        b, c192 = self.chain(ch, (192, 3, 2))
        mixed5 = Concat([b, nn.MaxPool2d(3, 2)])
        return nn.Sequential(s1, mixed3, mixed4, mixed5), c192 + ch

    def block_a(self, ch: int) -> tuple[Concat, int]:
        branches = [
            self.pooled(ch, 96),
            self.chain(ch, (96, 1, 1))[0],
            self.chain(ch, (64, 1, 1), (96, 3, 1))[0],
            self.chain(ch, (64, 1, 1), (96, 3, 1), (96, 3, 1))[0],
        ]
        return Concat(branches), 4 * self.c(96)

    def reduction_a(self, ch: int) -> tuple[Concat, int]:
        b1, o1 = self.chain(ch, (384, 3, 2))
        b2, o2 = self.chain(ch, (192, 1, 1), (224, 3, 1), (256, 3, 2))
        return Concat([b1, b2, nn.MaxPool2d(3, 2)]), o1 + o2 + ch

    def block_b(self, ch: int) -> tuple[Concat, int]:
        b3, o3 = self.chain(ch, (192, 1, 1), (224, (1, 7), 1), (256, (7, 1), 1))
        b4, o4 = self.chain(
            ch, (192, 1, 1), (192, (7, 1), 1), (224, (1, 7), 1), (224, (7, 1), 1), (256, (1, 7), 1)
        )
        branches = [self.pooled(ch, 128), self.chain(ch, (384, 1, 1))[0], b3, b4]
        return Concat(branches), self.c(128) + self.c(384) + o3 + o4

    def reduction_b(self, ch: int) -> tuple[Concat, int]:
        b1, o1 = self.chain(ch, (192, 1, 1), (192, 3, 2))
        b2, o2 = self.chain(ch, (256, 1, 1), (256, (1, 7), 1), (320, (7, 1), 1), (320, 3, 2))
        return Concat([b1, b2, nn.MaxPool2d(3, 2)]), o1 + o2 + ch

    def block_c(self, ch: int) -> tuple[Concat, int]:
        def split(trunk: nn.Sequential, mid: int) -> Split:
            heads = [self.chain(mid, (256, (1, 3), 1))[0], self.chain(mid, (256, (3, 1), 1))[0]]
            return Split(trunk, heads)

        t3, m3 = self.chain(ch, (384, 1, 1))
        t4, m4 = self.chain(ch, (384, 1, 1), (448, (3, 1), 1), (512, (1, 3), 1))
        plain = self.chain(ch, (256, 1, 1))[0]
        branches = [self.pooled(ch, 256), plain, split(t3, m3), split(t4, m4)]
        return Concat(branches), 6 * self.c(256)


def build_inception_v4(
    *, num_classes: int, width: float, dropout: float, blocks: Sequence[int] = (4, 7, 3)
) -> nn.Sequential:
    """Inception-v4 with ``blocks`` = (#A, #B, #C) modules (published: 4, 7, 3)."""
    check_positive(width=width, num_classes=num_classes)
    if len(blocks) != 3 or any(int(n) < 0 for n in blocks):
        raise ValueError(f"inception-v4: blocks must be 3 non-negative counts, got {tuple(blocks)}")
    make = _Builder(width)
    stem, ch = make.stem()
    layers: list[nn.Module] = [stem]
    stages = (make.block_a, make.reduction_a, make.block_b, make.reduction_b, make.block_c)
    repeats = (int(blocks[0]), 1, int(blocks[1]), 1, int(blocks[2]))
    for build_block, n in zip(stages, repeats, strict=True):
        for _ in range(n):
            block, ch = build_block(ch)
            layers.append(block)
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(dropout)]
    layers.append(nn.Linear(ch, num_classes))
    return nn.Sequential(*layers)


#: Zhang et al. 2017, Fig. 3, after the first conv: an Inception module is (1x1 channels,
#: 3x3 channels); a downsample module is (3x3 channels,).
SMALL_LAYOUT: tuple[tuple[int, ...], ...] = (
    (32, 32), (32, 48), (80,),
    (112, 48), (96, 64), (80, 80), (48, 96), (96,),
    (176, 160), (176, 160),
)  # fmt: skip


def build_inception_small(*, num_classes: int, width: float) -> nn.Sequential:
    """Zhang et al.'s small Inception; ``width`` scales every channel count."""
    check_positive(width=width, num_classes=num_classes)
    ch = scale(96, width)
    layers: list[nn.Module] = [ConvBNReLU(3, ch, 3, padding=1)]
    for spec in SMALL_LAYOUT:
        if len(spec) == 2:
            n1, n3 = scale(spec[0], width), scale(spec[1], width)
            layers.append(Concat([ConvBNReLU(ch, n1, 1), ConvBNReLU(ch, n3, 3, padding=1)]))
            ch = n1 + n3
        else:
            n3 = scale(spec[0], width)
            conv = ConvBNReLU(ch, n3, 3, stride=2, padding=1)
            layers.append(Concat([conv, nn.MaxPool2d(3, 2, padding=1)]))
            ch += n3
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(ch, num_classes)]
    return nn.Sequential(*layers)
