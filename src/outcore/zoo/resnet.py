"""Residual networks (He et al. 2016): CIFAR ResNets, ImageNet ResNets, and arbitrary depth.

* CIFAR (He et al. §4.2, the ResNet-32 Dymem §4.3.2 studies): a 3x3 conv to 16 channels, then
  three stages of n basic blocks with 16, 32, 64 channels (stride 1, 2, 2), global average
  pool, FC-10; depth = 6n + 2 (ResNet-32: n = 5, i.e. 15 residual blocks). Shortcuts are
  identities; where the shape changes they subsample by 2 and pad the new channels with zeros
  (option A), so the net has no projection parameters (0.46M parameters for ResNet-32).
  ``batchnorm=False`` gives the BN-free variant Dymem's Figure 15 runs.
* ImageNet (He et al. Table 1): 7x7/2 stem to 64 channels, 3x3/2 max pool, four stages of basic
  blocks (ResNet-18/34) or bottlenecks (ResNet-50/101/152) with 64, 128, 256, 512 channels
  (x4 out of a bottleneck), projection shortcuts (1x1 conv + BN) where the shape changes.
  A bottleneck strides in its 3x3 convolution, as in the Torch implementation
  (fb.resnet.torch) that Dymem follows.
* Arbitrary depth (``stages_for_units``): SuperNeurons Table 4 grows a bottleneck ResNet with
  depth = 3(n1 + n2 + n3 + n4) + 2 by fixing n1 = 6, n2 = 32, n4 = 6 and raising n3. Its
  headline "ResNet2500 ... 10^4 basic layers ... at batch 1 on a 12 GB GPU" must mean depth
  2500, i.e. about 833 units (0.92G parameters, ~10 layers per unit): 2500 *units* at full
  width would hold 2.78G parameters, 11 GB of fp32 weights before any gradient.

Every residual join is an out-of-place ``branch + shortcut`` followed by ReLU.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from outcore.zoo.layers import check_positive, relu, scale

#: Blocks per stage for the named ImageNet depths: (block kind, stages).
IMAGENET: dict[int, tuple[str, tuple[int, int, int, int]]] = {
    18: ("basic", (2, 2, 2, 2)),
    34: ("basic", (3, 4, 6, 3)),
    50: ("bottleneck", (3, 4, 6, 3)),
    101: ("bottleneck", (3, 4, 23, 3)),
    152: ("bottleneck", (3, 8, 36, 3)),
}


def _norm(channels: int, batchnorm: bool) -> nn.Module:
    return nn.BatchNorm2d(channels) if batchnorm else nn.Identity()


def _conv(in_ch: int, out_ch: int, kernel: int, stride: int, batchnorm: bool) -> nn.Conv2d:
    # A convolution followed by BatchNorm needs no bias (BN's shift replaces it).
    return nn.Conv2d(in_ch, out_ch, kernel, stride, padding=kernel // 2, bias=not batchnorm)


class PadShortcut(nn.Module):
    """Option-A shortcut: subsample by ``stride`` and zero-pad the extra channels."""

    def __init__(self, extra_channels: int, stride: int) -> None:
        super().__init__()
        self.extra_channels = extra_channels
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride > 1:
            x = x[:, :, :: self.stride, :: self.stride]
        return F.pad(x, (0, 0, 0, 0, 0, self.extra_channels))


class BasicBlock(nn.Module):
    """Two 3x3 convolutions (+BN) with a ReLU between, added to the shortcut, then ReLU."""

    def __init__(
        self, in_ch: int, out_ch: int, stride: int, *, batchnorm: bool, pad_shortcut: bool
    ) -> None:
        super().__init__()
        self.branch = nn.Sequential(
            _conv(in_ch, out_ch, 3, stride, batchnorm), _norm(out_ch, batchnorm), relu(),
            _conv(out_ch, out_ch, 3, 1, batchnorm), _norm(out_ch, batchnorm),
        )  # fmt: skip
        self.shortcut = _shortcut(in_ch, out_ch, stride, batchnorm=batchnorm, pad=pad_shortcut)
        self.out = relu()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.branch(x) + self.shortcut(x))


class Bottleneck(nn.Module):
    """1x1 reduce → 3x3 (strided) → 1x1 expand to 4x, each with BN, added to the shortcut."""

    expansion = 4

    def __init__(self, in_ch: int, mid: int, stride: int, *, batchnorm: bool = True) -> None:
        super().__init__()
        out_ch = mid * self.expansion
        self.branch = nn.Sequential(
            _conv(in_ch, mid, 1, 1, batchnorm), _norm(mid, batchnorm), relu(),
            _conv(mid, mid, 3, stride, batchnorm), _norm(mid, batchnorm), relu(),
            _conv(mid, out_ch, 1, 1, batchnorm), _norm(out_ch, batchnorm),
        )  # fmt: skip
        self.shortcut = _shortcut(in_ch, out_ch, stride, batchnorm=batchnorm, pad=False)
        self.out = relu()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.branch(x) + self.shortcut(x))


def _shortcut(in_ch: int, out_ch: int, stride: int, *, batchnorm: bool, pad: bool) -> nn.Module:
    if stride == 1 and in_ch == out_ch:
        return nn.Identity()
    if pad:
        return PadShortcut(out_ch - in_ch, stride)
    return nn.Sequential(_conv(in_ch, out_ch, 1, stride, batchnorm), _norm(out_ch, batchnorm))


def build_resnet_cifar(
    *, depth: int, num_classes: int, width: float, batchnorm: bool
) -> nn.Sequential:
    """CIFAR ResNet of ``depth`` = 6n + 2 layers (20, 32, 44, 56, 110, ...)."""
    check_positive(width=width, num_classes=num_classes)
    if depth < 8 or (depth - 2) % 6:
        raise ValueError(
            f"resnet-cifar: depth must be 6n + 2 with n >= 1 (8, 14, 20, 32, ...), got {depth}"
        )
    n = (depth - 2) // 6
    c16 = scale(16, width)
    layers: list[nn.Module] = [_conv(3, c16, 3, 1, batchnorm), _norm(c16, batchnorm), relu()]
    prev = c16
    for stage, channels in enumerate((16, 32, 64)):
        out = scale(channels, width)
        for i in range(n):
            stride = 2 if stage > 0 and i == 0 else 1
            layers.append(BasicBlock(prev, out, stride, batchnorm=batchnorm, pad_shortcut=True))
            prev = out
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(prev, num_classes)]
    return nn.Sequential(*layers)


def build_resnet(
    *, block: str, stages: Sequence[int], num_classes: int, width: float
) -> nn.Sequential:
    """ImageNet-style ResNet with ``stages[i]`` blocks of kind ``block`` in stage i."""
    check_positive(width=width, num_classes=num_classes)
    if block not in ("basic", "bottleneck"):
        raise ValueError(f"resnet: block must be 'basic' or 'bottleneck', got {block!r}")
    if len(stages) != 4 or any(int(n) < 1 for n in stages):
        raise ValueError(f"resnet: stages must be 4 positive block counts, got {tuple(stages)}")
    c64 = scale(64, width)
    layers: list[nn.Module] = [
        nn.Conv2d(3, c64, 7, 2, padding=3, bias=False), nn.BatchNorm2d(c64), relu(),
        nn.MaxPool2d(3, 2, padding=1),
    ]  # fmt: skip
    prev = c64
    for stage, (n_blocks, channels) in enumerate(zip(stages, (64, 128, 256, 512), strict=True)):
        mid = scale(channels, width)
        for i in range(int(n_blocks)):
            stride = 2 if stage > 0 and i == 0 else 1
            if block == "basic":
                layers.append(BasicBlock(prev, mid, stride, batchnorm=True, pad_shortcut=False))
                prev = mid
            else:
                layers.append(Bottleneck(prev, mid, stride))
                prev = mid * Bottleneck.expansion
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(prev, num_classes)]
    return nn.Sequential(*layers)


def stages_for_units(units: int) -> tuple[int, int, int, int]:
    """Bottleneck blocks per stage for a ResNet of ``units`` residual units (depth 3·units + 2).

    Above 44 units, SuperNeurons' rule (Table 4): (6, 32, units − 44, 6). Up to 44, the same
    idea at a smaller scale: one block in stages 1, 2 and 4, the rest in stage 3.
    """
    if units < 4:
        raise ValueError(f"resnet-units: units must be >= 4 (one per stage), got {units}")
    if units > 44:
        return (6, 32, units - 44, 6)
    return (1, 1, units - 3, 1)


def build_resnet_units(*, units: int, num_classes: int, width: float) -> nn.Sequential:
    """A bottleneck ResNet of ``units`` residual units (depth 3·units + 2).

    The units are spread over the stages by ``stages_for_units``.
    """
    return build_resnet(
        block="bottleneck", stages=stages_for_units(units), num_classes=num_classes, width=width
    )
