"""GoogLeNet / Inception v1 (Szegedy et al. 2015, "Going deeper with convolutions", Table 1).

Nine Inception modules, each a fan of four branches (1x1; 1x1→3x3; 1x1→5x5; 3x3 max-pool→1x1)
joined by concatenation. No BatchNorm (it postdates the net); local response normalisation
after the first pool and after conv2, as in the Caffe reference model; pools round up (Caffe).
The two auxiliary classifiers are left out: they only add a weighted loss during training and
would make the model return three outputs. Global average pooling ends the net, so any input of
at least 32x32 works (224 is the published size).
"""

from __future__ import annotations

from torch import nn

from outcore.zoo.layers import Concat, ConvReLU, check_positive, scale

#: Table 1 of Szegedy et al.: (#1x1, #3x3 reduce, #3x3, #5x5 reduce, #5x5, pool proj).
MODULES: dict[str, tuple[int, int, int, int, int, int]] = {
    "3a": (64, 96, 128, 16, 32, 32),
    "3b": (128, 128, 192, 32, 96, 64),
    "4a": (192, 96, 208, 16, 48, 64),
    "4b": (160, 112, 224, 24, 64, 64),
    "4c": (128, 128, 256, 24, 64, 64),
    "4d": (112, 144, 288, 32, 64, 64),
    "4e": (256, 160, 320, 32, 128, 128),
    "5a": (256, 160, 320, 32, 128, 128),
    "5b": (384, 192, 384, 48, 128, 128),
}
#: A stride-2 max pool follows these modules.
POOL_AFTER = ("3b", "4e")


def inception(in_ch: int, spec: tuple[int, ...], width: float) -> tuple[Concat, int]:
    """One Inception-v1 module; returns it and its output channel count."""
    n1, r3, n3, r5, n5, pp = (scale(c, width) for c in spec)
    module = Concat([
        ConvReLU(in_ch, n1, 1),
        nn.Sequential(ConvReLU(in_ch, r3, 1), ConvReLU(r3, n3, 3, padding=1)),
        nn.Sequential(ConvReLU(in_ch, r5, 1), ConvReLU(r5, n5, 5, padding=2)),
        nn.Sequential(nn.MaxPool2d(3, 1, padding=1, ceil_mode=True), ConvReLU(in_ch, pp, 1)),
    ])  # fmt: skip
    return module, n1 + n3 + n5 + pp


def build_googlenet(*, num_classes: int, width: float, dropout: float, lrn: bool) -> nn.Sequential:
    """GoogLeNet without auxiliary heads; ``width`` scales every channel count."""
    check_positive(width=width, num_classes=num_classes)

    def norm() -> list[nn.Module]:
        return [nn.LocalResponseNorm(5, alpha=1e-4, beta=0.75, k=1.0)] if lrn else []

    c64, c192 = scale(64, width), scale(192, width)
    layers: list[nn.Module] = [
        ConvReLU(3, c64, 7, stride=2, padding=3), nn.MaxPool2d(3, 2, ceil_mode=True), *norm(),
        ConvReLU(c64, c64, 1), ConvReLU(c64, c192, 3, padding=1), *norm(),
        nn.MaxPool2d(3, 2, ceil_mode=True),
    ]  # fmt: skip
    channels = c192
    for name, spec in MODULES.items():
        module, channels = inception(channels, spec, width)
        layers.append(module)
        if name in POOL_AFTER:
            layers.append(nn.MaxPool2d(3, 2, ceil_mode=True))
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(dropout)]
    layers.append(nn.Linear(channels, num_classes))
    return nn.Sequential(*layers)
