"""Item size of a dtype as the IR spells it ("float32", "torch.bfloat16").

One helper for every place that turns an IR tensor's dtype name into bytes (capture's
activation totals, the compiled backend's fused-kernel byte counts). Invariant: the answer
is torch's own ``element_size()`` for that dtype; torch is imported lazily so that importing
``outcore.graph`` stays torch-free.
"""

from __future__ import annotations

from functools import cache

from outcore.errors import GraphError


@cache
def itemsize(dtype: str) -> int:
    """Bytes per element of ``dtype``; a ``GraphError`` naming the dtype if torch lacks it."""
    import torch

    name = dtype.removeprefix("torch.")
    torch_dtype = getattr(torch, name, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise GraphError(f"tensor dtype {dtype!r} is not a torch dtype, so its item size is "
                         "unknown. Way out: capture the graph again with this PyTorch version, "
                         "or report the dtype to outcore.")
    return torch.empty((), dtype=torch_dtype).element_size()
