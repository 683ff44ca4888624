"""A table of convolution configurations as users write them (shared by the variant
conformance tests and the end-to-end policy tests): 1-, 2- and 3-d, stride, dilation, groups,
depthwise, channels_last, every padding mode, transposed; float32 and float64.

``CONFIGS``: name -> ``Config``; ``Config.layer()`` builds the torch.nn layer and
``Config.input()`` an input for it (``channels_last`` applied to both).
``Config.supported``: the variants that must be offered for it (the framework kernel always
is); every other variant must be refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

_CLASSES = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}


@dataclass(frozen=True)
class Config:
    dims: int
    c: int
    o: int
    size: tuple[int, ...]
    kernel: Any
    supported: frozenset[str]
    kwargs: dict[str, Any] = field(default_factory=dict)
    channels_last: bool = False
    transposed: bool = False
    dtype: torch.dtype = torch.float32
    n: int = 2

    def layer(self) -> nn.Module:
        if self.transposed:
            cls = {1: nn.ConvTranspose1d, 2: nn.ConvTranspose2d, 3: nn.ConvTranspose3d}
            layer = cls[self.dims](self.c, self.o, self.kernel, **self.kwargs)
        else:
            layer = _CLASSES[self.dims](self.c, self.o, self.kernel, **self.kwargs)
        layer = layer.to(self.dtype)
        if self.channels_last:
            fmt = torch.channels_last if self.dims == 2 else torch.channels_last_3d
            layer = layer.to(memory_format=fmt)
        return layer

    def input(self, seed: int = 0) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(self.n, self.c, *self.size, dtype=self.dtype, generator=g)
        if self.channels_last:
            fmt = torch.channels_last if self.dims == 2 else torch.channels_last_3d
            x = x.contiguous(memory_format=fmt)
        return x


BOTH = frozenset({"im2col", "fft"})
IM2COL = frozenset({"im2col"})
NONE: frozenset[str] = frozenset()

CONFIGS: dict[str, Config] = {
    "1d": Config(1, 4, 6, (19,), 5, IM2COL, {"padding": 2}),
    "1d strided dilated": Config(1, 3, 5, (23,), 3, IM2COL,
                                 {"stride": 2, "dilation": 2, "padding": 1}),
    "1d grouped": Config(1, 8, 8, (17,), 3, IM2COL, {"groups": 4, "padding": 1}),
    "2d 3x3": Config(2, 3, 8, (10, 9), 3, BOTH, {"padding": 1}),
    "2d 1x1": Config(2, 6, 4, (7, 7), 1, BOTH),
    "2d stem 7x7/2": Config(2, 3, 8, (20, 18), 7, BOTH, {"stride": 2, "padding": 3,
                                                          "bias": False}),
    "2d asymmetric": Config(2, 3, 5, (11, 8), (3, 1), BOTH, {"stride": (2, 1),
                                                              "padding": (1, 0)}),
    "2d dilated": Config(2, 3, 6, (12, 12), 3, IM2COL, {"dilation": 2, "padding": 2}),
    "2d grouped": Config(2, 8, 12, (9, 9), 3, IM2COL, {"groups": 4, "padding": 1}),
    "2d depthwise": Config(2, 6, 6, (9, 10), 3, IM2COL, {"groups": 6, "padding": 1}),
    "2d depthwise strided": Config(2, 6, 12, (11, 11), 5, IM2COL,
                                   {"groups": 6, "stride": 2, "padding": 2}),
    "2d channels_last": Config(2, 3, 8, (10, 9), 3, NONE, {"padding": 1},
                               channels_last=True),
    "2d reflect": Config(2, 3, 4, (9, 9), 3, BOTH, {"padding": 1, "padding_mode": "reflect"}),
    "2d circular": Config(2, 3, 4, (9, 9), 3, BOTH, {"padding": 2,
                                                     "padding_mode": "circular"}),
    "2d replicate": Config(2, 3, 4, (8, 9), 3, BOTH, {"padding": 1,
                                                      "padding_mode": "replicate"}),
    "2d same": Config(2, 3, 4, (9, 8), 4, BOTH, {"padding": "same"}),
    "2d transposed": Config(2, 4, 3, (6, 6), 3, NONE, {"stride": 2}, transposed=True),
    "2d float64": Config(2, 3, 5, (9, 9), 3, BOTH, {"padding": 1, "stride": 2},
                         dtype=torch.float64),
    "3d": Config(3, 2, 4, (5, 6, 7), 3, IM2COL, {"padding": 1}),
    "3d strided grouped": Config(3, 4, 4, (6, 7, 5), (3, 1, 3), IM2COL,
                                 {"stride": (2, 1, 1), "groups": 2, "padding": (1, 0, 0)}),
    "3d channels_last": Config(3, 2, 4, (5, 5, 5), 3, NONE, {"padding": 1},
                               channels_last=True),
    "1d float16": Config(1, 4, 4, (9,), 3, NONE, {"padding": 1}, dtype=torch.float16),
}
