"""AlexNet (Krizhevsky et al. 2012) and OverFeat (Sermanet et al. 2014): the early ImageNet nets.

AlexNet follows the Caffe reference model the papers profile (SuperNeurons lists its 23 layers:
CONV1→RELU1→LRN1→POOL1→CONV2→RELU2→LRN2→POOL2→CONV3→RELU3→CONV4→RELU4→CONV5→RELU5→POOL5→
FC1→RELU6→Dropout1→FC2→RELU7→Dropout2→FC3→Softmax): 227x227 input, conv2/4/5 split in two
groups (the original two-GPU layout), local response normalisation after conv1 and conv2.

OverFeat has two published models (Sermanet et al. 2014, Tables 1 and 3): "fast" (231x231,
what the Facebook convnet-benchmarks reference that vDNN uses implements) and "accurate"
(221x221). Neither uses normalisation; both end in a two-hidden-layer classifier.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from outcore.zoo.layers import (
    ConvReLU,
    Size2,
    check_positive,
    check_spatial,
    conv_out,
    mlp_head,
    scale,
)


def _through(windows: list[tuple[int, int, int]]) -> Callable[[int], int]:
    """Input length → output length after (kernel, stride, padding) windows applied in turn."""

    def final(size: int) -> int:
        for kernel, stride, padding in windows:
            size = conv_out(size, kernel, stride, padding) if size >= kernel - 2 * padding else 0
        return size

    return final


def build_alexnet(
    *,
    image_size: Size2,
    num_classes: int,
    width: float,
    dropout: float,
    lrn: bool,
    grouped: bool,
) -> nn.Sequential:
    """AlexNet as in Caffe's reference model; ``lrn``/``grouped`` toggle LRN and the 2-way split."""
    check_positive(width=width, num_classes=num_classes)
    groups = 2 if grouped else 1
    c1, c2, c3, c4, c5 = (scale(c, width, multiple=groups) for c in (96, 256, 384, 384, 256))

    def norm() -> list[nn.Module]:
        # Krizhevsky et al. §3.3: n=5, alpha=1e-4, beta=0.75, k=2.
        return [nn.LocalResponseNorm(5, alpha=1e-4, beta=0.75, k=2.0)] if lrn else []

    windows = [(11, 4, 0), (3, 2, 0), (5, 1, 2), (3, 2, 0)] + [(3, 1, 1)] * 3 + [(3, 2, 0)]
    h, w = check_spatial("alexnet", image_size, _through(windows))
    features = nn.Sequential(
        ConvReLU(3, c1, 11, stride=4), *norm(), nn.MaxPool2d(3, 2),
        ConvReLU(c1, c2, 5, padding=2, groups=groups), *norm(), nn.MaxPool2d(3, 2),
        ConvReLU(c2, c3, 3, padding=1),
        ConvReLU(c3, c4, 3, padding=1, groups=groups),
        ConvReLU(c4, c5, 3, padding=1, groups=groups),
        nn.MaxPool2d(3, 2),
    )  # fmt: skip
    head = mlp_head(c5 * h * w, scale(4096, width), num_classes, dropout)
    return nn.Sequential(features, head)


def build_overfeat(
    *, variant: str, image_size: Size2, num_classes: int, width: float, dropout: float
) -> nn.Sequential:
    """OverFeat ``variant`` "fast" (Table 1) or "accurate" (Table 3) of Sermanet et al. 2014."""
    check_positive(width=width, num_classes=num_classes)
    c = {n: scale(n, width) for n in (96, 256, 512, 1024, 3072, 4096)}
    if variant == "fast":
        windows = [(11, 4, 0), (2, 2, 0), (5, 1, 0), (2, 2, 0)] + [(3, 1, 1)] * 3 + [(2, 2, 0)]
        features = nn.Sequential(
            ConvReLU(3, c[96], 11, stride=4), nn.MaxPool2d(2, 2),
            ConvReLU(c[96], c[256], 5), nn.MaxPool2d(2, 2),
            ConvReLU(c[256], c[512], 3, padding=1),
            ConvReLU(c[512], c[1024], 3, padding=1),
            ConvReLU(c[1024], c[1024], 3, padding=1), nn.MaxPool2d(2, 2),
        )  # fmt: skip
        hidden = (c[3072], c[4096])
    elif variant == "accurate":
        windows = [(7, 2, 0), (3, 3, 0), (7, 1, 0), (2, 2, 0)] + [(3, 1, 1)] * 4 + [(3, 3, 0)]
        features = nn.Sequential(
            ConvReLU(3, c[96], 7, stride=2), nn.MaxPool2d(3, 3),
            ConvReLU(c[96], c[256], 7), nn.MaxPool2d(2, 2),
            ConvReLU(c[256], c[512], 3, padding=1),
            ConvReLU(c[512], c[512], 3, padding=1),
            ConvReLU(c[512], c[1024], 3, padding=1),
            ConvReLU(c[1024], c[1024], 3, padding=1), nn.MaxPool2d(3, 3),
        )  # fmt: skip
        hidden = (c[4096], c[4096])
    else:
        raise ValueError(f"overfeat: variant must be 'fast' or 'accurate', got {variant!r}")
    h, w = check_spatial(f"overfeat-{variant}", image_size, _through(windows))
    head = nn.Sequential(
        nn.Flatten(),
        nn.Linear(c[1024] * h * w, hidden[0]), nn.ReLU(inplace=False), nn.Dropout(dropout),
        nn.Linear(hidden[0], hidden[1]), nn.ReLU(inplace=False), nn.Dropout(dropout),
        nn.Linear(hidden[1], num_classes),
    )  # fmt: skip
    return nn.Sequential(features, head)
