"""ResNeXt-101 3D (Hara, Kataoka and Satoh, CVPR 2018, "Can spatiotemporal 3D CNNs retrace
the history of 2D CNNs and ImageNet?"): 3D bottleneck blocks with grouped 3x3x3 convolutions
(cardinality 32), stages (3, 4, 23, 3), 16-frame 112x112 clips, 400 Kinetics classes.
Shortcuts are projection convolutions ("type B") where the shape changes.
"""

from __future__ import annotations

import torch
from torch import nn


class Bottleneck3d(nn.Module):
    """1x1x1 reduce -> grouped 3x3x3 -> 1x1x1 expand (x2), BatchNorm and ReLU after each."""

    expansion = 2

    def __init__(self, inplanes: int, planes: int, cardinality: int, stride: int) -> None:
        super().__init__()
        mid = cardinality * (planes // 32)
        out = planes * self.expansion
        self.conv1 = nn.Conv3d(inplanes, mid, 1, bias=False)
        self.bn1 = nn.BatchNorm3d(mid)
        self.conv2 = nn.Conv3d(mid, mid, 3, stride=stride, padding=1, groups=cardinality,
                               bias=False)
        self.bn2 = nn.BatchNorm3d(mid)
        self.conv3 = nn.Conv3d(mid, out, 1, bias=False)
        self.bn3 = nn.BatchNorm3d(out)
        self.relu = nn.ReLU(inplace=False)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or inplanes != out:
            self.shortcut = nn.Sequential(nn.Conv3d(inplanes, out, 1, stride=stride, bias=False),
                                          nn.BatchNorm3d(out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.relu(self.bn1(self.conv1(x)))
        h = self.relu(self.bn2(self.conv2(h)))
        h = self.bn3(self.conv3(h))
        return self.relu(h + self.shortcut(x))


def build_resnext3d(stages: tuple[int, ...] = (3, 4, 23, 3), cardinality: int = 32,
                    num_classes: int = 400, width: float = 1.0) -> nn.Module:
    """ResNeXt-3D with ``stages`` bottleneck blocks per stage; ``width`` scales the planes
    (keeping them multiples of 32 / cardinality groups)."""
    base = max(32, int(64 * width) // 32 * 32)
    stem = max(8, int(64 * width))
    layers: list[nn.Module] = [nn.Conv3d(3, stem, 7, stride=(1, 2, 2), padding=3, bias=False),
                               nn.BatchNorm3d(stem), nn.ReLU(inplace=False),
                               nn.MaxPool3d(3, stride=2, padding=1)]
    inplanes = stem
    for i, blocks in enumerate(stages):
        planes = base * 2 ** (i + 1)
        for j in range(blocks):
            stride = 2 if (j == 0 and i > 0) else 1
            layers.append(Bottleneck3d(inplanes, planes, cardinality, stride))
            inplanes = planes * Bottleneck3d.expansion
    layers += [nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(inplanes, num_classes)]
    return nn.Sequential(*layers)
