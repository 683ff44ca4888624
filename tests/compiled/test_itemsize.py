"""The shared dtype item-size helper agrees with torch and refuses unknown dtypes."""

from __future__ import annotations

import pytest
import torch

from outcore.errors import GraphError
from outcore.graph.dtypes import KNOWN, itemsize


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64,
                                   torch.bool, torch.float64, torch.uint8])
def test_itemsize_matches_torch(dtype: torch.dtype) -> None:
    name = str(dtype).removeprefix("torch.")
    expected = torch.empty((), dtype=dtype).element_size()
    assert itemsize(name) == expected
    assert itemsize(f"torch.{name}") == expected


@pytest.mark.parametrize("bad", ["float33", "nn", "Tensor"])
def test_itemsize_refuses_non_dtype(bad: str) -> None:
    with pytest.raises(GraphError, match=repr(bad)):
        itemsize(bad)


@pytest.mark.parametrize("name", sorted(KNOWN))
def test_the_torch_free_table_agrees_with_torch(name: str) -> None:
    expected = torch.empty((), dtype=getattr(torch, name)).element_size()
    assert KNOWN[name] == expected


def test_a_dtype_outside_the_table_asks_torch() -> None:
    assert "uint16" not in KNOWN
    assert itemsize("torch.uint16") == 2
