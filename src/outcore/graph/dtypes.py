"""Item size of a dtype as the IR spells it ("float32", "torch.bfloat16").

One helper for every place that turns an IR tensor's dtype name into bytes (capture's
activation totals, the compiled backend's fused-kernel byte counts, the data-parallel
gradient buckets, the operator variants' argument views). Invariants: the answer is torch's
own ``element_size()`` for that dtype; the common dtypes are answered from a table without
importing torch (the planning pieces ``outcore.plan.grad_buckets`` and
``outcore.variants.meta`` stay torch-free), any other name asks torch, imported lazily.
"""

from __future__ import annotations

from functools import cache

from outcore.errors import GraphError

#: Bytes per element of the dtypes planning meets, under torch's names and aliases; checked
#: against torch's ``element_size()`` by the tests.
KNOWN: dict[str, int] = {
    "float64": 8, "double": 8, "float32": 4, "float": 4, "float16": 2, "half": 2,
    "bfloat16": 2, "complex64": 8, "complex128": 16, "int64": 8, "long": 8, "int32": 4,
    "int": 4, "int16": 2, "short": 2, "int8": 1, "uint8": 1, "bool": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1,
}


@cache
def itemsize(dtype: str) -> int:
    """Bytes per element of ``dtype``; a ``GraphError`` naming the dtype if torch lacks it."""
    name = str(dtype).removeprefix("torch.")
    if name in KNOWN:
        return KNOWN[name]
    import torch

    torch_dtype = getattr(torch, name, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise GraphError(f"tensor dtype {dtype!r} is not a torch dtype, so its item size is "
                         "unknown. Way out: capture the graph again with this PyTorch version, "
                         "or report the dtype to outcore.")
    return torch.empty((), dtype=torch_dtype).element_size()
