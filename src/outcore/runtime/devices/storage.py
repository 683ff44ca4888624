"""Raw storage helpers shared by the devices: layouts, byte views, poison.

A device copies a tensor's whole storage as bytes and keeps its ``TensorLayout`` beside
them; ``TensorLayout.view`` rebuilds the tensor over any storage of the same size, so the
round trip is bit-identical for every dtype, stride and storage offset. None of these
helpers allocates device memory or runs under the caller's dispatch modes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import _disable_current_modes


@dataclass(frozen=True)
class TensorLayout:
    """What is needed to rebuild a tensor over a copy of its storage's bytes."""

    dtype: torch.dtype
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    nbytes: int

    @classmethod
    def of(cls, t: torch.Tensor) -> TensorLayout:
        # Runtime tensors are concrete, so the offset is a plain int (int() of an int is
        # itself); the stubs also allow a SymInt, which only symbolic tracing produces.
        return cls(t.dtype, tuple(t.size()), tuple(t.stride()), int(t.storage_offset()),
                   t.untyped_storage().nbytes())

    def view(self, storage: torch.UntypedStorage) -> torch.Tensor:
        """A tensor with this layout over ``storage`` (no allocation, no dispatch mode)."""
        with _disable_current_modes():
            empty = torch.empty(0, dtype=self.dtype, device=storage.device)
            return empty.set_(storage, self.offset, self.size, self.stride)


def byte_view(storage: torch.UntypedStorage) -> torch.Tensor:
    """A flat uint8 tensor over the whole of ``storage``."""
    with _disable_current_modes():
        return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def poison_storage(storage: torch.UntypedStorage, dtype: torch.dtype) -> None:
    """Overwrite ``storage`` with values no computation is likely to produce.

    Floating and complex: NaN; signed integers: the minimum; unsigned: the maximum;
    bool: every value negated (so the damage is visible whatever the data). Other dtypes
    get 0xFF bytes.
    """
    count = storage.nbytes() // dtype.itemsize
    with _disable_current_modes(), torch.no_grad():
        typed = torch.empty(0, dtype=dtype, device=storage.device).set_(storage, 0, (count,),
                                                                        (1,))
        if dtype.is_floating_point or dtype.is_complex:
            typed.fill_(float("nan"))
        elif dtype == torch.bool:
            typed.logical_not_()
        else:
            try:
                info = torch.iinfo(dtype)
            except TypeError:
                byte_view(storage).fill_(0xFF)
                return
            typed.fill_(info.min if info.min < 0 else info.max)
