"""FCN-32s (Long, Shelhamer & Darrell 2015), the fully-convolutional segmentation net moDNN tests.

VGG-16's convolutions with the classifier turned into convolutions (fc6 = 7x7 conv to 4096,
fc7 = 1x1 conv to 4096), a 1x1 scoring layer to ``num_classes``, and one transposed
convolution that upsamples by 32 (kernel 64). As in the reference Caffe net, conv1_1 pads by
100 pixels and the pools round up, so any input of at least 32x32 pixels gives a score map
that covers the image; the output is cropped at offset 19 back to the input's height and
width. The model returns per-pixel logits (batch, num_classes, H, W); the loss is per-pixel
cross-entropy against integer labels (batch, H, W).

The upsampling filter starts as bilinear interpolation. The paper keeps FCN-32s's final filter
fixed; here it is a learned parameter (as in FCN-16s/8s), so that every parameter of the zoo
takes a gradient.
"""

from __future__ import annotations

import torch
from torch import nn

from outcore.zoo.layers import Size2, check_positive, check_spatial, conv_out, relu, scale
from outcore.zoo.vgg import CHANNELS, CONFIGS

CROP_OFFSET = 19
UPSAMPLE = 32


def bilinear_kernel(channels: int, size: int) -> torch.Tensor:
    """A (channels, channels, size, size) transposed-conv weight that upsamples bilinearly."""
    factor = (size + 1) // 2
    center = factor - 1 if size % 2 == 1 else factor - 0.5
    ramp = 1 - (torch.arange(size, dtype=torch.float32) - center).abs() / factor
    kernel = ramp[:, None] * ramp[None, :]
    weight = torch.zeros(channels, channels, size, size)
    for c in range(channels):
        weight[c, c] = kernel
    return weight


class FCN32s(nn.Module):
    """FCN-32s over a VGG-16 trunk; see the module docstring for the layout."""

    def __init__(
        self, *, image_size: Size2, num_classes: int, width: float, dropout: float
    ) -> None:
        super().__init__()
        check_positive(width=width, num_classes=num_classes)
        layers: list[nn.Module] = []
        prev = 3
        for group, (n_convs, channels) in enumerate(zip(CONFIGS[16], CHANNELS, strict=True)):
            out = scale(channels, width)
            for i in range(n_convs):
                pad = 100 if group == 0 and i == 0 else 1
                layers += [nn.Conv2d(prev, out, 3, padding=pad), relu()]
                prev = out
            layers.append(nn.MaxPool2d(2, 2, ceil_mode=True))
        hidden = scale(4096, width)
        layers += [
            nn.Conv2d(prev, hidden, 7), relu(), nn.Dropout(dropout),
            nn.Conv2d(hidden, hidden, 1), relu(), nn.Dropout(dropout),
            nn.Conv2d(hidden, num_classes, 1),
        ]  # fmt: skip
        self.score = nn.Sequential(*layers)
        self.upscore = nn.ConvTranspose2d(
            num_classes, num_classes, 2 * UPSAMPLE, stride=UPSAMPLE, bias=False
        )
        with torch.no_grad():
            self.upscore.weight.copy_(bilinear_kernel(num_classes, 2 * UPSAMPLE))
        # The score map must cover the crop window; with the 100-pixel pad it does for any size.
        check_spatial("fcn", image_size, lambda size: self._upscored(size) - CROP_OFFSET - size + 1)

    @staticmethod
    def _upscored(size: int) -> int:
        """Length of the upsampled score map along one axis for an input of ``size`` pixels."""
        size += 2 * 100 - 2  # conv1_1 pads by 100; the other 3x3 convs keep the size
        for _ in CHANNELS:
            size = conv_out(size, 2, 2, ceil=True)
        size = size - 7 + 1  # fc6
        return (size - 1) * UPSAMPLE + 2 * UPSAMPLE if size >= 1 else 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        up = self.upscore(self.score(x))
        return up[:, :, CROP_OFFSET : CROP_OFFSET + h, CROP_OFFSET : CROP_OFFSET + w]


def build_fcn(*, image_size: Size2, num_classes: int, width: float, dropout: float) -> FCN32s:
    """FCN-32s for ``image_size`` inputs and ``num_classes`` classes (21 in PASCAL VOC)."""
    return FCN32s(image_size=image_size, num_classes=num_classes, width=width, dropout=dropout)
