"""Small building blocks shared by the zoo's networks.

Every activation in the zoo is built with ``inplace=False``. In eager PyTorch an in-place ReLU
saves one feature map, but outcore never runs the model eagerly when it matters: the training
step is captured as a functional ATen graph (aot_autograd functionalises in-place ops anyway),
and the planner decides what is kept. Out-of-place activations make the eager oracle and the
captured graph agree op for op, and keep the eager reference free of aliasing surprises.

Invariant: nothing here reads tensor data at construction time (no ``.item()``, no
data-dependent shapes), so every block builds under ``FakeTensorMode``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

Size2 = int | tuple[int, int]


def pair(size: Size2) -> tuple[int, int]:
    """``size`` as (height, width); an int means a square."""
    if isinstance(size, int):
        return (size, size)
    h, w = size
    return (int(h), int(w))


def scale(channels: int, width: float, multiple: int = 1) -> int:
    """``channels * width`` rounded to a positive multiple of ``multiple``.

    ``width`` is the zoo's width multiplier; 1.0 gives the published channel counts exactly.
    """
    scaled = max(1.0, channels * width / multiple)
    return max(multiple, round(scaled) * multiple)


def conv_out(size: int, kernel: int, stride: int = 1, padding: int = 0, ceil: bool = False) -> int:
    """Output length of a convolution or pooling window along one axis (PyTorch's formula)."""
    span = size + 2 * padding - kernel
    if ceil:
        out = -(-span // stride) + 1
        # PyTorch drops a last window that would start entirely inside the right padding.
        if (out - 1) * stride >= size + padding:
            out -= 1
        return out
    return span // stride + 1


def relu() -> nn.ReLU:
    """An out-of-place ReLU (see the module docstring for why never in place)."""
    return nn.ReLU(inplace=False)


class ConvBNReLU(nn.Sequential):
    """Convolution (no bias) → BatchNorm (training mode) → ReLU; the usual 'BasicConv2d'."""

    def __init__(
        self,
        in_ch: int,
        out_ch: int,
        kernel: int | tuple[int, int],
        stride: int = 1,
        padding: int | tuple[int, int] = 0,
        eps: float = 1e-5,
    ) -> None:
        super().__init__(
            nn.Conv2d(in_ch, out_ch, kernel, stride=stride, padding=padding, bias=False),
            nn.BatchNorm2d(out_ch, eps=eps),
            relu(),
        )


class ConvReLU(nn.Sequential):
    """Convolution with bias → ReLU, as in the pre-BatchNorm networks (AlexNet, VGG, ...)."""

    def __init__(
        self,
        in_ch: int,
        out_ch: int,
        kernel: int | tuple[int, int],
        stride: int = 1,
        padding: int | tuple[int, int] = 0,
        groups: int = 1,
    ) -> None:
        super().__init__(
            nn.Conv2d(in_ch, out_ch, kernel, stride=stride, padding=padding, groups=groups),
            relu(),
        )


class Concat(nn.Module):
    """Runs each branch on the same input and concatenates the results along channels (fan/join)."""

    def __init__(self, branches: Sequence[nn.Module]) -> None:
        super().__init__()
        self.branches = nn.ModuleList(branches)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([branch(x) for branch in self.branches], dim=1)


def mlp_head(in_features: int, hidden: int, num_classes: int, dropout: float) -> nn.Sequential:
    """The classic classifier: (Linear → ReLU → Dropout) × 2 → Linear (AlexNet, VGG, OverFeat).

    The order follows Caffe's reference nets, as SuperNeurons lists AlexNet's layers
    (FC1 → RELU6 → Dropout1 → FC2 → RELU7 → Dropout2 → FC3).
    """
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(in_features, hidden),
        relu(),
        nn.Dropout(dropout),
        nn.Linear(hidden, hidden),
        relu(),
        nn.Dropout(dropout),
        nn.Linear(hidden, num_classes),
    )


def check_positive(**values: float) -> None:
    """Raise ValueError naming every argument that is not > 0."""
    bad = [f"{k}={v!r}" for k, v in values.items() if not v > 0]
    if bad:
        raise ValueError(f"these options must be positive: {', '.join(bad)}")


def smallest_input(final_size: Callable[[int], int], limit: int = 4096) -> int:
    """The least input length for which ``final_size`` (input length → last map length) is >= 1."""
    for size in range(1, limit + 1):
        if final_size(size) >= 1:
            return size
    return limit


def check_spatial(
    model: str, image_size: Size2, final_size: Callable[[int], int]
) -> tuple[int, int]:
    """The last feature map's (height, width) for ``image_size`` inputs.

    ``final_size`` maps an input length to the last map's length along one axis.
    Raises ValueError, naming the smallest input that works, when the map would be empty.
    """
    h, w = (final_size(s) for s in pair(image_size))
    if h < 1 or w < 1:
        raise ValueError(
            f"{model}: image_size={image_size!r} is too small (the last feature map would be "
            f"{h}x{w}); use image_size >= {smallest_input(final_size)}."
        )
    return h, w
