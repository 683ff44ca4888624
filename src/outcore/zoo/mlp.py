"""A multi-layer perceptron: the simplest linear chain, for oracle tests and hand-checked plans."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from outcore.zoo.layers import check_positive, relu


def build_mlp(
    *,
    in_features: int,
    num_classes: int,
    hidden: int,
    depth: int,
    widths: Sequence[int] = (),
) -> nn.Sequential:
    """Linear → ReLU repeated, then a Linear to ``num_classes`` logits.

    ``widths`` lists the hidden layer widths; when empty, ``depth`` hidden layers of ``hidden``
    units are used. ``depth=0`` gives a single Linear (logistic regression).
    """
    hidden_widths = [int(w) for w in widths] if widths else [hidden] * depth
    check_positive(in_features=in_features, num_classes=num_classes)
    if depth < 0:
        raise ValueError(f"mlp: depth must be >= 0, got {depth}")
    if any(w <= 0 for w in hidden_widths):
        raise ValueError(f"mlp: every hidden width must be positive, got {hidden_widths}")
    layers: list[nn.Module] = []
    prev = in_features
    for width in hidden_widths:
        layers += [nn.Linear(prev, width), relu()]
        prev = width
    layers.append(nn.Linear(prev, num_classes))
    return nn.Sequential(*layers)
